"""Summarise an evaluation's records: one row per method (metrics.py defines every column), priced against the
roofline of the chosen hw with each drafter's own cost, LLMCad's streaming projection where hw's memory cannot hold
the target, answer quality when asked (eval.quality), then summary.{json,csv}, plots and the logger."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import pandas as pd

from specbench.config import build
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.base import Drafter
from specbench.evaluation.engines import print_engines, with_agreement
from specbench.evaluation.metrics import decoded, summarize
from specbench.evaluation.plan import Plan
from specbench.evaluation.quality import with_quality
from specbench.hardware.measured.profiler import latency_profile
from specbench.hardware.modelled.llmcad import project_llmcad
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.models.shape import ModelShape
from specbench.reporting.loggers import log_run
from specbench.reporting.plots import save_plots

log = logging.getLogger(__name__)
# the printed table: speedup is the headline (ratio of means against the fastest plain decoding, `fastest_ar`)
TABLE = ["method", "backend", "dtype", "weights", "tau", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high",
         "speedup_mean_of_ratios", "speedup_vs_baseline", "ideal_speedup", "projected_speedup", "lossless_match",
         "eager_match", "method_mem_mb", "num_prompts"]


def summarise(cfg, plan: Plan, hw: HardwareSpec, records: pd.DataFrame, drafters: dict[str, Drafter],
              memory: dict[str, int], out: Path) -> pd.DataFrame:
    """drafters: every run's drafter by label; memory: each method's measured peak allocation."""
    target = plan.target
    profile = _latency_profile(cfg, plan, hw, out)
    costs = {label: d.cost() for label, d in drafters.items()} if hw.partition == "gpu_only" else {}
    summary = summarize(records, profile, partial(roofline_step_time, ModelShape.of(target.model), hw), memory,
                        costs, target.max_context, cfg.eval.max_new_tokens)
    summary = _with_streaming(summary, drafters, target, hw)
    summary = with_quality(summary, records, cfg.eval.quality, target.tokenizer, out)  # pass@1 by execution
    summary = with_agreement(summary, records)  # engine rows: token agreement with the project's plain decoding
    _write(summary, out)
    plots = save_plots(decoded(records), summary, out / "plots", profile)
    log_run(build(cfg.logger) if cfg.get("logger") else None, cfg, summary, plots, out / "records.jsonl")
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.precision", 3):
        print(summary[[c for c in TABLE if c in summary]].to_string(index=False))  # records before a column lack it
    print_engines(summary)
    print(f"speedup: ratio of means against the fastest plain decoding here ({summary['fastest_ar'].iloc[0]}), "
          "95% paired bootstrap CI")
    _note_cut(decoded(records), cfg.eval.max_new_tokens, target.max_context)
    print(f"run folder: {out}")
    return summary


def _note_cut(records: pd.DataFrame, max_new_tokens: int, max_context: int) -> None:
    """Name the prompts whose prompt + max_new_tokens pass the context: their answers may stop early."""
    cut = records[records["prompt_len"] + max_new_tokens > max_context].drop_duplicates(["question_id", "turn"])
    if len(cut):
        shown = ", ".join(f"{q} (turn {t + 1}, {n} tokens)" for q, t, n in
                          cut[["question_id", "turn", "prompt_len"]].head(5).itertuples(index=False))
        log.warning("%d prompt(s) plus eval.max_new_tokens=%d pass the model's context of %d tokens, so their answers "
                    "may stop early (cut_by_context): %s%s", len(cut), max_new_tokens, max_context, shown,
                    ", ..." if len(cut) > 5 else "")


def _with_streaming(summary: pd.DataFrame, drafters: dict[str, Drafter], target, hw) -> pd.DataFrame:
    """LLMCad's projection where hw's memory budget cannot hold the target: per-token latency with its weights
    streamed from storage, and with drafting overlapped with the loads (projected_* columns; plain decoding and
    draft-model methods, whose draft is what stays resident)."""
    shape, rows = ModelShape.of(target.model), []
    for _, row in summary.iterrows():
        drafter = drafters.get(row["method"])
        draft = drafter.cost().draft if drafter is not None else None
        plain = isinstance(drafter, AutoregressiveDrafter)
        rows.append(project_llmcad(row, hw, shape, draft or shape) if draft or plain else {})
    return pd.concat([summary, pd.DataFrame(rows, index=summary.index)], axis=1)


def _latency_profile(cfg, plan: Plan, hw: HardwareSpec, out: Path) -> pd.DataFrame | None:
    """L(n) for the ideal speedup: from the machine profile when there is one, else measured once per run folder
    (reused on resume); beside the roofline of the chosen hw."""
    if not cfg.eval.latency_profile:
        return None
    path = out / "latency_profile.csv"
    if path.exists():
        return pd.read_csv(path)
    execution, machine, target = plan.execution, plan.machine, plan.target
    if machine is not None and (execution.backend, execution.dtype, execution.weights) in machine.executions:
        profile = machine.curve(execution.dtype, plan.context, execution.backend, execution.weights)
    else:
        profile = latency_profile(target.model, sizes=tuple(cfg.eval.profile_sizes),
                                  context=int(cfg.eval.profile_context), repeats=cfg.eval.profile_repeats)
    shape = ModelShape.of(target.model)
    profile["roofline_ms"] = [1e3 * roofline_step_time(shape, hw, n, plan.context) for n in profile["tokens"]]
    profile.to_csv(path, index=False)
    return profile


def _write(summary: pd.DataFrame, out: Path) -> None:
    summary.to_json(out / "summary.json", orient="records", indent=2)
    flat = summary.copy()
    flat["per_depth_acceptance"] = flat["per_depth_acceptance"].map(lambda r: json.dumps([round(x, 4) for x in r]))
    flat.to_csv(out / "summary.csv", index=False)
