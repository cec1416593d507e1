"""task=eval: plan -> decode -> summarise. Plain decoding and every listed method decode the dataset interleaved per
prompt into records.jsonl; the summary, plots and logger files come from those records.

Settings are checked before anything loads (evaluation/plan.py: request), the run folder's settings before the
dataset; the run folder is locked until the run ends, however it ends.
"""

from __future__ import annotations

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from specbench.config import build
from specbench.evaluation.evaluator import Evaluator

from specbench.evaluation.plan import plan_runs, request
from specbench.evaluation.run_folder import open_run_folder, provenance
from specbench.evaluation.summary import summarise
from specbench.names import PLAIN
from specbench.reporting.paper_table import report_after_run
from specbench.tasks._common import run_dir, setup_target
from specbench.tasks.report import command_line


def run(cfg, overrides: list[str] | None = None) -> pd.DataFrame:
    """overrides: the command line's, which every `methods` entry is composed on (read from Hydra inside a run)."""
    out = run_dir(cfg)
    with open_run_folder(out):
        req = request(cfg, overrides)
        hw, loaded = setup_target(cfg)
        plan = plan_runs(cfg, req, hw, loaded, out)
        evaluator = Evaluator(plan.target, plan.runs, req.sampling, build(cfg.dataset), plan.settings, out,
                              provenance(cfg, plan.execution.dtype, plan.execution.backend, plan.execution.weights),
                              plan.settings_hash[PLAIN])
        records = evaluator.run()
        summary = summarise(cfg, plan, hw, records, {r.label: r.drafter for r in evaluator.runs}, evaluator.memory(),
                            out)
        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep reports at its end
            report_after_run(cfg.get("report"), out, command_line(cfg))
    return summary
