"""task=eval: the baseline and every listed method on the dataset, interleaved per prompt -> records.jsonl,
summary.{json,csv}, plots/, logger files.

Settings are validated before any dataset or model is loaded, and the run folder's settings before the dataset.
With eval.dtype=auto the target is loaded once in float32 and the machine profile picks the dtype; with
model.backend=auto it picks the execution backend too. Plain decoding also runs on the backend and dtype fastest for
it here when that differs: the headline speedup is judged against the fastest plain decoding measured.
"""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from specbench.acceptance.exact import ExactAcceptance
from specbench.config import build
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.base import DrafterCost
from specbench.drafters.medusa import MedusaDrafter
from specbench.evaluation.evaluator import EvalSettings, Evaluator, MethodRun
from specbench.evaluation.hf_generate import HF_GENERATE, check_greedy
from specbench.evaluation.methods import build_drafter, check_tree, resolve_entries
from specbench.evaluation.metrics import BASELINE, EAGER_REFERENCE, decoded, summarize
from specbench.evaluation.precision import AUTO, check_dtype, plan
from specbench.evaluation.provenance import (
    check_and_save_settings,
    open_run_folder,
    provenance,
    settings_hash,
    shared_settings,
)
from specbench.evaluation.quality import with_quality
from specbench.hardware.measured.machine_profile import load_or_measure_profile
from specbench.hardware.measured.profiler import latency_profile
from specbench.hardware.modelled.llmcad import project_llmcad
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import MEASURED
from specbench.models.backends import check_backend, check_profile_backends, with_backend
from specbench.models.loading import with_dtype
from specbench.models.shape import ModelShape
from specbench.reporting.loggers import log_run
from specbench.reporting.paper_table import report_after_run
from specbench.reporting.plots import save_plots
from specbench.sampling import SamplingParams
from specbench.tasks._common import run_dir, setup_target
from specbench.tasks.report import command_line
from specbench.trees.hardware_aware import HardwareAwarePolicy

# the printed table: speedup is the headline (ratio of means against the fastest plain decoding, `fastest_ar`)
TABLE = ["method", "backend", "dtype", "tau", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high",
         "speedup_mean_of_ratios", "speedup_vs_baseline", "ideal_speedup", "projected_speedup", "lossless_match",
         "eager_match", "method_mem_mb", "num_prompts"]
BASELINE_SETTINGS = {"method": {"name": BASELINE}, "accept": {"name": "exact"}}


def run(cfg, overrides: list[str] | None = None) -> pd.DataFrame:
    """overrides: the command line's, which every `methods` entry is composed on (read from Hydra inside a run).
    The run folder is locked until the run ends, however it ends, and its files are checked before anything loads."""
    with open_run_folder(run_dir(cfg)):
        return _run(cfg, overrides)


def _run(cfg, overrides: list[str] | None) -> pd.DataFrame:
    out = run_dir(cfg)
    settings = EvalSettings(max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.eval.seed, warmup=cfg.eval.warmup,
                            baseline=cfg.eval.baseline, first_turn_only=cfg.eval.first_turn_only,
                            memory_probe=cfg.eval.memory_probe, batch_size=cfg.eval.batch_size)
    check_dtype(cfg.eval.dtype)
    check_backend(cfg.model.backend)
    profile_backends = check_profile_backends(cfg.eval.profile_backends)
    sampling = SamplingParams(**cfg.sampling)
    if cfg.eval.hf_generate:
        check_greedy(sampling)
    if overrides is None and HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    entries = resolve_entries(cfg, overrides or [])
    trees = [build(e.cfg.tree) for e in entries]
    for entry, tree in zip(entries, trees):
        check_tree(entry.cfg.method.drafter, tree)
    hw, loaded = setup_target(cfg)
    sized = any(isinstance(t, HardwareAwarePolicy) for t in trees)
    backend = cfg.model.backend
    wants_profile = AUTO in (cfg.eval.dtype, backend) or cfg.eval.fastest_ar or sized
    backends = profile_backends if backend == AUTO or cfg.eval.fastest_ar else [backend]
    machine = load_or_measure_profile(loaded, backends=backends) if wants_profile else None
    context = cfg.eval.profile_context + cfg.eval.max_new_tokens / 2
    execution = plan(cfg.eval.dtype, backend, machine, float(np.mean([t.budget for t in trees])), context)
    print(f"backend/dtype {execution.reason}")
    cast = with_dtype(loaded, execution.dtype)  # drafters are built on it (build_drafter says why)
    target = with_backend(cast, execution.backend)
    if sized:
        trees = [t.fit(_latency_curve(hw, machine, target, execution, context))
                 if isinstance(t, HardwareAwarePolicy) else t for t in trees]

    shared = shared_settings(cfg, execution.dtype, execution.backend)
    per_method = {e.label: e.settings() for e in entries} | {BASELINE: BASELINE_SETTINGS}
    fast_b, fast_d = execution.fastest_ar
    extra = [] if not (cfg.eval.baseline and cfg.eval.fastest_ar) \
        or execution.fastest_ar == (execution.backend, execution.dtype) else [f"{BASELINE}@{execution.fastest_ar_label}"]
    per_method |= {label: {**BASELINE_SETTINGS, "dtype": fast_d, "backend": fast_b} for label in extra}
    eager_ref = cfg.eval.eager_reference and execution.backend != "eager" and EAGER_REFERENCE not in extra
    if eager_ref:  # the run's dtype on transformers' own forward: every method's tokens are also checked against it
        per_method[EAGER_REFERENCE] = {**BASELINE_SETTINGS, "dtype": execution.dtype, "backend": "eager"}
    if cfg.eval.hf_generate:
        per_method[HF_GENERATE] = {"method": {"name": HF_GENERATE}, "dtype": fast_d, "backend": "eager"}
    check_and_save_settings(out, shared, per_method)

    dataset = build(cfg.dataset)
    runs = [MethodRun(e.label, build_drafter(e.cfg.method.drafter, cast, tree, execution.backend), build(e.cfg.accept),
                      settings_hash(shared, per_method[e.label]), e.name) for e, tree in zip(entries, trees)]
    fast_cast = cast if fast_d == execution.dtype else with_dtype(loaded, fast_d)
    runs = [MethodRun(label, AutoregressiveDrafter(), ExactAcceptance(), settings_hash(shared, per_method[label]),
                      BASELINE, with_backend(fast_cast, fast_b)) for label in extra] + runs
    if eager_ref:
        runs.insert(len(extra), MethodRun(EAGER_REFERENCE, AutoregressiveDrafter(), ExactAcceptance(),
                                          settings_hash(shared, per_method[EAGER_REFERENCE]), BASELINE, cast))
    if cfg.eval.hf_generate:  # transformers' generate on the eager model, in the fastest plain decoding's dtype
        runs.append(MethodRun(HF_GENERATE, AutoregressiveDrafter(), ExactAcceptance(),
                              settings_hash(shared, per_method[HF_GENERATE]), HF_GENERATE, fast_cast))
    settings.chat_template = target.chat_template
    evaluator = Evaluator(target, runs, sampling, dataset, settings, out, provenance(cfg, execution.dtype, execution.backend),
                          settings_hash(shared, BASELINE_SETTINGS))
    records = evaluator.run()

    profile = _latency_profile(cfg, target, hw, out, machine, execution, context)
    drafters = {r.label: r.drafter for r in evaluator.runs}
    summary = summarize(records, profile, partial(roofline_step_time, ModelShape.of(target.model), hw),
                        evaluator.memory(), _drafter_costs(drafters, hw), target.max_context, cfg.eval.max_new_tokens)
    summary = _with_streaming(summary, drafters, target, hw)
    summary = with_quality(summary, records, cfg.eval.quality, target.tokenizer, out)  # pass@1 by execution
    _write_summary(summary, out)
    plots = save_plots(decoded(records), summary, out / "plots", profile)
    log_run(build(cfg.logger) if cfg.get("logger") else None, cfg, summary, plots, out / "records.jsonl")
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.precision", 3):
        print(summary[TABLE].to_string(index=False))
    print(f"speedup: ratio of means against the fastest plain decoding here ({summary['fastest_ar'].iloc[0]}), "
          "95% paired bootstrap CI")
    _note_cut(decoded(records), cfg.eval.max_new_tokens, target.max_context)
    print(f"run folder: {out}")
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep reports once, at its end
        report_after_run(cfg.get("report"), out, command_line(cfg))
    return summary


def _note_cut(records: pd.DataFrame, max_new_tokens: int, max_context: int) -> None:
    """Name the prompts whose prompt + max_new_tokens pass the context: their answers may stop early."""
    cut = records[records["prompt_len"] + max_new_tokens > max_context].drop_duplicates(["question_id", "turn"])
    if len(cut):
        shown = ", ".join(f"{q} (turn {t + 1}, {n} tokens)" for q, t, n in
                          cut[["question_id", "turn", "prompt_len"]].head(5).itertuples(index=False))
        print(f"note: {len(cut)} prompt(s) plus eval.max_new_tokens={max_new_tokens} pass the model's context of "
              f"{max_context} tokens, so their answers may stop early (cut_by_context): {shown}"
              + (", ..." if len(cut) > 5 else ""))


def _with_streaming(summary: pd.DataFrame, drafters: dict, target, hw) -> pd.DataFrame:
    """LLMCad's projection where hw's memory budget cannot hold the target: per-token latency with its weights
    streamed from storage, and with drafting overlapped with the loads (projected_* columns; plain decoding and
    draft-model methods, whose draft is what stays resident)."""
    shape, rows = ModelShape.of(target.model), []
    for _, row in summary.iterrows():
        draft = getattr(drafters.get(row["method"]), "draft", None)
        plain = row["method"] in drafters and isinstance(drafters[row["method"]], AutoregressiveDrafter)
        extra = project_llmcad(row, hw, shape, ModelShape.of(draft.model) if draft else shape) if draft or plain \
            else {}
        rows.append(extra)
    return pd.concat([summary, pd.DataFrame(rows, index=summary.index)], axis=1)


def _drafter_costs(drafters: dict, hw) -> dict[str, DrafterCost]:
    """What each drafter adds to a step in the roofline's projection: a draft model's forwards (how many per step,
    the records say), Medusa's heads; PPD's prompt tokens are rows of the target's forward already. Ghidorah's
    partitioned boards model target forwards only, so there the projection stays the target's."""
    if hw.partition != "gpu_only":
        return {}
    costs = {}
    for label, drafter in drafters.items():
        draft = getattr(drafter, "draft", None)
        if draft is not None:
            costs[label] = DrafterCost(draft=ModelShape.of(draft.model))
        elif isinstance(drafter, MedusaDrafter):
            costs[label] = DrafterCost(medusa_heads=drafter.num_heads)
    return costs


def _latency_curve(hw, machine, target, execution, context: float):
    """L(n) in ms for tree=hardware_aware: measured here (hw=cpu/cuda read the machine profile) or, for a board
    spec one projects to, its roofline at the board's own bytes per parameter."""
    if hw.peak_tflops == MEASURED:
        return lambda n: machine.latency_ms(execution.dtype, n, context, execution.backend)
    shape = ModelShape.of(target.model)
    return lambda n: 1e3 * roofline_step_time(shape, hw, n, context)


def _latency_profile(cfg, target, hw, out, machine, execution, context: float):
    """L(n) for the ideal speedup: from the machine profile when there is one, else measured once per run folder
    (reused on resume); beside the roofline of the chosen hw."""
    if not cfg.eval.latency_profile:
        return None
    path = out / "latency_profile.csv"
    if path.exists():
        return pd.read_csv(path)
    if machine is not None and (execution.backend, execution.dtype) in machine.executions:
        profile = machine.curve(execution.dtype, context, execution.backend)
    else:
        profile = latency_profile(target.model, sizes=tuple(cfg.eval.profile_sizes),
                                  context=int(cfg.eval.profile_context), repeats=cfg.eval.profile_repeats)
    shape = ModelShape.of(target.model)
    profile["roofline_ms"] = [1e3 * roofline_step_time(shape, hw, n, context) for n in profile["tokens"]]
    profile.to_csv(path, index=False)
    return profile


def _write_summary(summary: pd.DataFrame, out) -> None:
    summary.to_json(out / "summary.json", orient="records", indent=2)
    flat = summary.copy()
    flat["per_depth_acceptance"] = flat["per_depth_acceptance"].map(lambda r: json.dumps([round(x, 4) for x in r]))
    flat.to_csv(out / "summary.csv", index=False)
