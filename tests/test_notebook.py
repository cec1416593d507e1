"""The analysis notebook's code runs against a real (tiny) run folder."""

import json
from pathlib import Path

import matplotlib

from specbench.tasks import eval as eval_task

from .conftest import compose_cfg

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"


def test_notebook_cells_execute_on_a_run_folder(tmp_path, monkeypatch):
    matplotlib.use("Agg")
    run = tmp_path / "outputs" / "eval" / "tiny_run"
    eval_task.run(compose_cfg(["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=2",
                               "eval.max_new_tokens=8", "eval.warmup=0", "eval.latency_profile=false"], run))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        if cell["cell_type"] == "code":
            exec("".join(cell["source"]), scope)  # noqa: S102
    assert len(scope["summary"]) == 2 and set(scope["records"]["method"]) == {"autoregressive", "pld"}
