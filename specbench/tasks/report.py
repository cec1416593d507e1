"""task=report: a seed's table (our numbers beside the paper's) re-rendered from a finished run folder.

    python run.py task=report experiment=seeds/medusa_table1 report.run=outputs/eval/<the run's folder>

The experiment's `report` config names the paper YAML and the folder the table goes to; an evaluation, a sweep or
task=hardware run with a `report` writes the same table itself when it ends.
"""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig

from specbench.errors import SpecbenchError
from specbench.reporting.paper_table import project_path, report_after_run


def run(cfg):
    report = cfg.get("report")
    if not report or not report.get("run") or not report.get("paper"):
        raise SpecbenchError("task=report needs an experiment with a report (experiment=seeds/NAME) and "
                             "report.run=<the run or sweep folder to read>")
    run_folder = project_path(report.run)
    if not run_folder.is_dir():
        raise SpecbenchError(f"report.run='{report.run}' is not a folder; give the run or sweep folder to read")
    return report_after_run(report, run_folder, command_line(cfg, multirun=(run_folder / "multirun.yaml").exists()))


def command_line(cfg, multirun: bool = False) -> str:
    """The command that made the run, as the table quotes it (the experiment and its overrides)."""
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(("report.run=", "task="))] \
        if HydraConfig.initialized() else []
    return " ".join(["python run.py", *(["-m"] if multirun else []), *overrides])
