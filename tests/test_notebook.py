"""The analysis notebook executes under nbclient (a real kernel) on run folders of two setups, keeps them apart, and
redraws each run's standard plots."""

from pathlib import Path

import pytest
import nbformat
from nbclient import NotebookClient

from specbench.tasks import eval as eval_task

from .conftest import compose_cfg

pytestmark = pytest.mark.slow  # multi-process / notebook kernel: seconds each (README: the fast subset)

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"
TINY = ["model=tiny_random", "eval.num_prompts=2", "eval.max_new_tokens=8", "eval.warmup=0",
        "eval.latency_profile=false", "eval.fastest_plain=false", "eval.memory_probe=false", "eval.first_turn_only=true"]


@pytest.mark.slow
def test_notebook_executes_and_groups_runs_by_provenance(tmp_path, monkeypatch):
    for dtype in ("float32", "bfloat16"):  # two setups that must not be pooled
        eval_task.run(compose_cfg([*TINY, f"eval.dtype={dtype}"], tmp_path / "outputs" / "eval" / dtype))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    printed = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for out in cell.get("outputs", []))
    assert "2 run folders" in printed and "2 setups" in printed
    assert "float32" in printed and "bfloat16" in printed
    assert not any(out.get("output_type") == "error" for cell in notebook.cells for out in cell.get("outputs", []))
    for setup in ("setup0", "setup1"):  # each setup's run redrawn by the plots every run makes
        drawn = {p.name for p in (tmp_path / "analysis_plots" / setup).rglob("*") if p.is_file()}
        assert {"speed.png", "speed.pdf", "per_category.png", "memory.png"} <= drawn, (setup, drawn)
    images = [out for cell in notebook.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) >= 2 * 4
