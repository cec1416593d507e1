"""task=eval: baseline and method on the dataset -> records.jsonl, summary.{json,csv}, plots/, logger files."""

from __future__ import annotations

import json
from functools import partial

import pandas as pd

from specbench.sampling import SamplingParams
from specbench.config import build
from specbench.evaluation.evaluator import EvalSettings, Evaluator
from specbench.evaluation.methods import build_drafter
from specbench.evaluation.metrics import summarize
from specbench.hardware.profiler import latency_profile
from specbench.hardware.roofline import ModelShape, roofline_step_time
from specbench.reporting.loggers import log_run
from specbench.reporting.plots import save_plots
from specbench.tasks._common import run_dir, setup_target

TABLE = ["method", "tau", "tokens_per_s", "speedup", "overhead", "ideal_speedup", "projected_speedup",
         "lossless_match", "peak_mem_mb", "num_prompts"]


def run(cfg) -> pd.DataFrame:
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    sampling = SamplingParams(**cfg.sampling)  # validate cheap inputs before loading anything heavy
    dataset = build(cfg.dataset)
    hw, target = setup_target(cfg)
    tree = build(cfg.tree)
    drafter = build_drafter(cfg.method.drafter, target, tree)
    settings = EvalSettings(max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.eval.seed, warmup=cfg.eval.warmup,
                            chat_template=target.chat_template, baseline=cfg.eval.baseline)
    evaluator = Evaluator(target, cfg.method.name, drafter, build(cfg.accept), sampling, dataset, settings, out)
    records = evaluator.run()

    profile = _latency_profile(cfg, target, hw, out)
    summary = summarize(records, profile, partial(roofline_step_time, ModelShape.of(target.model), hw))
    _write_summary(summary, out)
    plots = save_plots(records, summary, out / "plots", profile)
    log_run(build(cfg.logger) if cfg.get("logger") else None, cfg, summary, plots)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 3):
        print(summary[TABLE].to_string(index=False))
    print(f"run folder: {out}")
    return summary


def _latency_profile(cfg, target, hw, out):
    """L(n) for the ideal speedup; measured once per run folder and reused on resume."""
    if not cfg.eval.latency_profile:
        return None
    path = out / "latency_profile.csv"
    if path.exists():
        return pd.read_csv(path)
    profile = latency_profile(target.model, sizes=tuple(cfg.eval.profile_sizes), context=cfg.eval.profile_context,
                              hw=hw)
    profile.to_csv(path, index=False)
    return profile


def _write_summary(summary: pd.DataFrame, out) -> None:
    summary.to_json(out / "summary.json", orient="records", indent=2)
    flat = summary.copy()
    flat["per_depth_acceptance"] = flat["per_depth_acceptance"].map(lambda r: json.dumps([round(x, 4) for x in r]))
    flat.to_csv(out / "summary.csv", index=False)
