"""Seed tables: our numbers beside a paper's, rendered from a run folder and a paper YAML."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

from specbench.config import CONF_DIR
from specbench.errors import SpecbenchError
from specbench.reporting.paper_table import load_paper, write_report
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
SEEDS = sorted(f"seeds/{p.stem}" for p in (CONF_DIR / "experiment" / "seeds").glob("*.yaml"))


def paper_yaml(path: Path, rows: list[dict], table: str = "summary.csv") -> Path:
    path.write_text(yaml.safe_dump({"title": "T", "paper": "P", "paper_setting": "PS", "ours_setting": "OS",
                                    "table": table, "kind": "MEASURED", "rows": rows}))
    return path


def run_folder(path: Path) -> Path:
    path.mkdir()
    pd.DataFrame({"method": ["plain", "medusa-8", "chain"], "tau": [1.0, 1.5, 1.2],
                  "tokens_per_s": [30.0, 36.0, 24.0], "tau_ci_low": [1.0, 1.4, 1.1], "tau_ci_high": [1.0, 1.6, 1.3],
                  "cpu_capability": "AVX512",
                  "git_commit": "abc"}).to_csv(path / "summary.csv", index=False)
    (path / "records.jsonl").write_text('{"method": "medusa-8"}\n')
    (path / ".lock").write_text("123")
    return path


def test_the_table_reads_each_quantity_from_the_run_and_divides_by_the_paper(tmp_path):
    paper = paper_yaml(tmp_path / "paper.yaml", [
        {"quantity": "tau", "paper": 3.0, "where": {"method": "medusa-8"}, "column": "tau"},
        {"quantity": "ours only", "paper": None, "where": {"method": "chain"}, "column": "tau"},
        {"quantity": "tree over chain", "paper": 2.0, "where": {"method": "medusa-8"}, "over": {"method": "chain"},
         "column": "tokens_per_s"}])
    out = tmp_path / "seed"
    md = write_report(run_folder(tmp_path / "run"), paper, out, "python run.py experiment=x").read_text()
    table = pd.read_csv(out / "results.csv").set_index("quantity")
    assert table.loc["tau", "ours"] == 1.5 and table.loc["tau", "ours/paper"] == 0.5
    assert pd.isna(table.loc["ours only", "paper"]) and table.loc["ours only", "ours"] == 1.2
    assert table.loc["tree over chain", "ours"] == pytest.approx(1.5)
    assert (table["kind"] == "MEASURED").all()
    assert "AVX512" in md and "python run.py experiment=x" in md and "| tau | method=medusa-8 | 3 | 1.5 [1.4, 1.6] | 0.5 |" in md
    assert (out / "run" / "records.jsonl").exists() and not (out / "run" / ".lock").exists()  # records ship


def test_a_row_that_selects_no_single_run_row_is_one_line(tmp_path):
    paper = paper_yaml(tmp_path / "paper.yaml", [{"quantity": "q", "paper": 1, "where": {"method": "ppd"},
                                                  "column": "tau"}])
    with pytest.raises(SpecbenchError, match="row 'q': method=ppd selects 0 rows"):
        write_report(run_folder(tmp_path / "run"), paper, tmp_path / "seed", "cmd")
    bad = paper_yaml(tmp_path / "bad.yaml", [{"quantity": "q", "paper": 1}])
    with pytest.raises(SpecbenchError, match="row 1 lacks column, where"):
        load_paper(bad)
    with pytest.raises(SpecbenchError, match="has no sweep_summary.csv"):
        write_report(tmp_path / "run", paper_yaml(tmp_path / "s.yaml", [], "sweep_summary.csv"), tmp_path / "o", "c")


@pytest.mark.parametrize("name", SEEDS)
def test_every_seed_experiment_names_a_valid_paper_yaml_and_pins_what_it_measures(name, tmp_path):
    cfg = compose_cfg([f"experiment={name}"], tmp_path)
    paper = load_paper(ROOT / cfg.report.paper)
    assert (ROOT / cfg.report.out).is_dir() and paper["rows"]
    if cfg.task == "eval":  # measured seeds pin what a table's numbers depend on
        assert cfg.eval.dtype != "auto" and cfg.model.backend != "auto" and cfg.eval.max_new_tokens == 64
        labels = {m if isinstance(m, str) else m.label or m.method for m in cfg.methods}
        wanted = {v for row in paper["rows"] for sel in (row["where"], row.get("over") or {})
                  for k, v in sel.items() if k == "method"}
        assert wanted <= labels, wanted - labels


def test_re_rendering_from_the_shipped_copy_keeps_it_and_a_projection_names_its_hw(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("hw: {name: jetson}\n")
    pd.DataFrame({"partition": ["hcmp"], "best_width": [16]}).to_csv(run / "ghidorah.csv", index=False)
    paper = paper_yaml(tmp_path / "paper.yaml", [{"quantity": "W", "paper": 16, "where": {"partition": "hcmp"},
                                                  "column": "best_width"}], table="ghidorah.csv")
    out = tmp_path / "seed"
    write_report(run, paper, out, "first")
    md = write_report(out / "run", paper, out, "again").read_text()
    assert (out / "run" / "ghidorah.csv").exists() and "again" in md
    assert "conf/hw/jetson.yaml" in md
