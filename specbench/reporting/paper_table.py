"""Our numbers beside a paper's: one table per seed result, rendered from a run folder and a YAML of the paper's
numbers, so rerunning a seed's experiment rewrites its table instead of leaving a hand-copied one behind.

The paper YAML (experiments/seed_*/paper.yaml) names the paper, its setting and ours, the run-folder file the rows
read (`table`: summary.csv for an evaluation, sweep_summary.csv for a sweep, a task=hardware CSV for a projection),
whether that file holds MEASURED or PROJECTED numbers, and one row per quantity:

    - {quantity: acceleration rate tau, paper: 3.47, where: {method: medusa-hw-aware}, column: tau}

`where` selects one row of the table (a column equal to a value), `column` is the number read; `over` (optional)
selects a second row and makes ours the ratio of the two (LLMCad's tree over a chain); `paper` may be null (no paper
counterpart: ours alone) and `note` says how the two differ. The result is results.md and results.csv in
the report's `out` folder, beside a copy of the run folder's small files (records.jsonl, settings, summaries, plots).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import yaml

from specbench.config import CONF_DIR
from specbench.errors import SpecbenchError
from specbench.names import current_columns

KINDS = ("MEASURED", "PROJECTED")
MACHINE = ["cpu_model", "cpu_capability", "threads", "gpu_name", "torch_version", "git_commit"]
SHIP_LIMIT = 5 * 2**20  # files copied beside the table: git keeps small ones only
SKIPPED = {".lock", "wandb"}


def load_paper(path: str | Path) -> dict:
    """The paper YAML, checked: one line naming the file and the key when something is missing."""
    path = Path(path)
    if not path.is_file():
        raise SpecbenchError(f"report.paper='{path}' is not a file; give the seed's paper YAML "
                             f"(experiments/seed_*/paper.yaml)")
    try:
        paper = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecbenchError(f"report.paper='{path}' is not readable YAML ({type(exc).__name__})") from None
    for key in ("title", "paper", "paper_setting", "ours_setting", "table", "kind", "rows"):
        if not isinstance(paper, dict) or key not in paper:
            raise SpecbenchError(f"report.paper='{path}' lacks the key '{key}'")
    if paper["kind"] not in KINDS:
        raise SpecbenchError(f"report.paper='{path}': kind={paper['kind']!r} is invalid; valid: {', '.join(KINDS)}")
    for i, row in enumerate(paper["rows"]):
        missing = {"quantity", "paper", "where", "column"} - set(row)
        if missing:
            raise SpecbenchError(f"report.paper='{path}': row {i + 1} lacks {', '.join(sorted(missing))}")
    return paper


def paper_table(table: pd.DataFrame, paper: dict) -> pd.DataFrame:
    """One row per quantity: the paper's number, ours read from `table`, ours / paper, and MEASURED/PROJECTED."""
    rows = []
    for spec in paper["rows"]:
        ours = _read(table, spec["where"], spec)
        low, high = (_read(table, spec["where"], {**spec, "column": f"{spec['column']}_ci_{end}"})
                     if f"{spec['column']}_ci_{end}" in table and not spec.get("over") else math.nan
                     for end in ("low", "high"))  # the headline speedup's paired bootstrap interval
        if spec.get("over"):
            ours /= _read(table, spec["over"], spec)
        theirs = spec["paper"]
        ratio = ours / theirs if theirs not in (None, 0) and ours is not None and math.isfinite(ours) else math.nan
        selects = _selector(spec["where"]) + (f" over {_selector(spec['over'])}" if spec.get("over") else "")
        rows.append({"quantity": spec["quantity"], "selects": selects,
                     "paper": math.nan if theirs is None else float(theirs), "ours": ours, "ci_low": low,
                     "ci_high": high, "ours/paper": ratio,
                     "kind": paper["kind"], "note": spec.get("note", "")})
    return pd.DataFrame(rows)


def _read(table: pd.DataFrame, where: dict, spec: dict) -> float:
    """spec's column in the one row of `table` that `where` selects."""
    rows = table
    for key, value in where.items():
        if key not in rows:
            raise SpecbenchError(f"the run's table has no column '{key}' (row '{spec['quantity']}'); it has: "
                                 f"{', '.join(map(str, table.columns[:30]))}")
        rows = rows[rows[key].astype(str) == str(value)]
    if spec["column"] not in table:
        raise SpecbenchError(f"the run's table has no column '{spec['column']}' (row '{spec['quantity']}')")
    if len(rows) != 1:
        raise SpecbenchError(f"row '{spec['quantity']}': {_selector(where)} selects {len(rows)} rows of the run's "
                             f"table, not one")
    return float(rows[spec["column"]].iloc[0])


def _selector(where: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in where.items())


def machine_line(table: pd.DataFrame, run: Path) -> str:
    """Where the numbers were made: the provenance columns of the run's table; a projection has none, so the hw
    spec it projects to is named (from the run's Hydra config)."""
    parts = [f"{k} {', '.join(map(str, dict.fromkeys(table[k].dropna())))}" for k in MACHINE
             if k in table and table[k].notna().any()]
    if parts:
        return "; ".join(parts)
    config = next(iter(sorted(run.glob("**/.hydra/config.yaml"))), None)
    hw = (yaml.safe_load(config.read_text()) or {}).get("hw", {}).get("name") if config else None
    return f"none measured: a projection onto the hardware spec conf/hw/{hw or '?'}.yaml"


def to_markdown(frame: pd.DataFrame, paper: dict, command: str, machine: str) -> str:
    """results.md: the paper and our setting, the machine, the command, and the table."""
    def num(x):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"

    lines = [f"# {paper['title']}", "",
             "Generated by specbench.reporting.paper_table from the run folder and paper.yaml: do not edit by hand.", "",
             f"- **Paper:** {paper['paper']}", f"- **Paper's setting:** {paper['paper_setting']}",
             f"- **Ours:** {paper['ours_setting']}", f"- **Machine:** {machine}", f"- **Command:** `{command}`", "",
             "| quantity | selects | paper | ours [95% CI] | ours / paper | kind | note |", "|---|---|---|---|---|---|---|"]
    for _, r in frame.iterrows():
        ci = f" [{num(r['ci_low'])}, {num(r['ci_high'])}]" if math.isfinite(r["ci_low"]) else ""
        lines.append(f"| {r['quantity']} | {r['selects']} | {num(r['paper'])} | {num(r['ours'])}{ci} | "
                     f"{num(r['ours/paper'])} | {r['kind']} | {r['note']} |")
    if frame["quantity"].astype(str).str.contains("speedup").any() or any("speedup" in str(r.get("column", ""))
                                                                            for r in paper["rows"]):
        lines += ["", "`speedup` is against the fastest plain decoding of the same weights measured in the run "
                      "(`fastest_plain`), as the papers compare; `speedup_any` against the fastest of any weights."]
    return "\n".join(lines) + "\n"


def write_report(run: str | Path, paper_path: str | Path, out: str | Path, command: str) -> Path:
    """results.md/.csv in `out` from the run folder `run` (an evaluation's, a sweep's or task=hardware's), with the
    run folder's small files copied to out/run/ so the numbers ship with their records."""
    run, out = Path(run), Path(out)
    paper = load_paper(paper_path)
    source = run / paper["table"]
    if not source.is_file():
        raise SpecbenchError(f"report.run='{run}' has no {paper['table']}; give the folder the seed's experiment "
                             f"wrote (python run.py experiment=...)")
    table = current_columns(pd.read_csv(source))
    frame = paper_table(table, paper)
    out.mkdir(parents=True, exist_ok=True)
    shipped = out / "run"
    if shipped.resolve() != run.resolve():  # re-rendering from the shipped copy itself keeps it
        _ship(run, shipped)
    frame.to_csv(out / "results.csv", index=False, float_format="%.4g")
    target = out / "results.md"
    target.write_text(to_markdown(frame, paper, command, machine_line(table, run)), encoding="utf-8")
    return target


def _ship(run: Path, shipped: Path) -> None:
    """The run folder's small files (records, settings, summaries, plots, Hydra's config) copied beside the table."""
    if shipped.exists():
        shutil.rmtree(shipped)
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run)
        if path.is_file() and path.stat().st_size <= SHIP_LIMIT and not SKIPPED & set(rel.parts):
            (shipped / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, shipped / rel)


def report_after_run(report_cfg, run: str | Path, command: str) -> Path | None:
    """The `report` config of an experiment ({paper, out}), paths relative to the project root: the table for the
    run just finished; None when the experiment has no report (config.yaml's report has its keys, all null)."""
    if not report_cfg or not (report_cfg.get("paper") or report_cfg.get("out")):
        return None
    missing = [k for k in ("paper", "out") if not report_cfg.get(k)]
    if missing:
        raise SpecbenchError(f"report.{missing[0]} is not set; a report needs report.paper (the paper YAML) and "
                             f"report.out (the folder the table is written to)")
    target = write_report(run, project_path(report_cfg["paper"]), project_path(report_cfg["out"]), command)
    print(f"report: {target}")
    return target


def project_path(path: str | Path) -> Path:
    """A relative path as given when it exists from here, else against the project root (runs from elsewhere)."""
    path = Path(path)
    return path if path.is_absolute() or path.exists() else CONF_DIR.parent / path
