"""Summarise an evaluation's records: one row per method (metrics.py defines every column), priced against the
roofline of the chosen hw with each drafter's own cost, LLMCad's streaming projection where hw's memory cannot hold
the target, answer quality when asked (eval.quality), then summary.{json,csv}, plots and the logger."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from functools import partial
from pathlib import Path

import pandas as pd

from specbench.config import build
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.base import Drafter
from specbench.evaluation.engines import print_engines, with_agreement
from specbench.evaluation.metrics import busy_note, decoded, skipped_note, summarize
from specbench.evaluation.plan import Plan
from specbench.evaluation.quality import with_quality
from specbench.hardware.measured.machine_profile import mark_stale
from specbench.hardware.measured.profiler import latency_profile
from specbench.execution.backends import OWN_GRAPH
from specbench.execution.row_claims import DIFFERS
from specbench.hardware.modelled.llmcad import project_llmcad
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.execution.value import Execution
from specbench.models.shape import ModelShape
from specbench.names import PLAIN, is_plain
from specbench.reporting.loggers import log_run
from specbench.reporting.plots import save_plots

log = logging.getLogger(__name__)
PLAN_MARGIN = 1.05  # a plain decoding measured this much faster than the profile's fastest is a disagreement


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
    summary = _with_row_checks(summary, plan)
    _write(summary, out)
    plots = save_plots(decoded(records), summary, out / "plots", profile)
    log_run(build(cfg.logger) if cfg.get("logger") else None, cfg, summary, plots, out / "records.jsonl")
    print_table(summary)
    for line in filter(None, [skipped_note(summary, target.max_context), busy_note(summary)]):
        print(line)
    for line in _plan_disagreements(summary, plan):
        print(line)
    print_engines(summary)
    _note_cut(decoded(records), cfg.eval.max_new_tokens, target.max_context)
    print(f"run folder: {out}")
    return summary


def print_table(summary: pd.DataFrame) -> None:
    """The table a newcomer reads: what ran, on which execution, how far it drafted, how fast against the same
    weights' fastest plain decoding and against any weights', and whether it kept plain decoding's tokens. Every
    other column is in summary.csv. A speedup below 1 is followed by why, in the run's own numbers."""
    weights = summary["weights"] if "weights" in summary else pd.Series(["fp"] * len(summary))  # older summaries
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 40):
        print(pd.DataFrame({
            "method": summary["method"],
            "execution": [Execution(b, d, w).label if isinstance(d, str) else f"{b}/{w}"  # an engine: its own dtype
                          for b, d, w in zip(summary["backend"], summary["dtype"], weights)],
            "tau": summary["tau"].map("{:.2f}".format),
            "tok/s": summary["tokens_per_s"].map("{:.1f}".format),
            "speedup [95% CI]": [_with_ci(*v) for v in
                                 zip(summary["speedup"], summary["speedup_ci_low"], summary["speedup_ci_high"])],
            "vs any weights": summary["speedup_any"].map("{:.2f}x".format),
            **({"vs engine (decode)": [f"{t:.2f}x ({d:.2f}x)" for t, d in zip(summary["speedup_engine"],
                                                                         summary["decode_speedup_engine"])]}
               if summary.get("fastest_engine", pd.Series(dtype=object)).notna().any() else {}),
            "lossless": [_lossless(r) for _, r in summary.iterrows()],
        }).to_string(index=False))
    own = dict(zip(summary["method"], weights))  # an engine's weights have no plain decoding of ours to stand on
    same = "; ".join(f"{w}: {ref}" if own.get(ref) == w else f"{w}: none decoded here, so {ref} ({own.get(ref)})"
                     for w, ref in dict(zip(weights, summary["fastest_plain"])).items())
    engine = summary["fastest_engine"].iloc[0] if "fastest_engine" in summary else math.nan
    print(f"speedup: ratio of means against the fastest plain decoding of the same weights ({same}), 95% paired "
          f"bootstrap CI; vs any weights: against {summary['fastest_plain_any'].iloc[0]}"
          + (f"; vs engine: against the fastest engine's plain decoding ({engine}), total and decode-only tok/s"
             if isinstance(engine, str) else "") + "; more columns in summary.csv")
    for line in _why_slower(summary):
        print(line)


def _with_ci(speedup: float, low: float, high: float) -> str:
    return f"{speedup:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if pd.notna(low) and pd.notna(high) else "")


def _lossless(row: pd.Series) -> str:
    """lossless_match as prompts equal to the reference's plain decoding. Lossy rules and sampling promise none; a
    plain decoding on another execution (dtype, weights, engine) is another computation: its share is agreement."""
    if row["method"] == PLAIN:
        return "reference"
    if pd.notna(row.get("identical", math.nan)):  # an engine: other kernels, agreement is what can be said
        return f"{round(row['identical'] * row['num_prompts'])}/{row['num_prompts']} identical (engine)"
    if pd.isna(row["lossless_match"]):
        return "not promised"
    matched = f"{round(row['lossless_match'] * row['num_prompts'])}/{row['num_prompts']}"
    if row["method"].startswith(f"{PLAIN}@"):
        return f"{matched} agree (another execution)"
    if row.get("row_check") == DIFFERS:  # the machine's row check found this verify route's rows apart
        return f"{matched} = {row['lossless_reference']}, not promised here"
    return f"{matched} = {row['lossless_reference']}"


def _with_row_checks(summary: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """row_check: the machine profile's verdict on each row's execution (row_invariance.py), where it checked it;
    row_check_note: what it found, one line."""
    checks = plan.machine.rows if plan.machine is not None else {}
    labels = [Execution(b, d, w).label if isinstance(d, str) else None
              for b, d, w in zip(summary["backend"], summary["dtype"], summary.get("weights", ["fp"] * len(summary)))]
    return summary.assign(row_check=[checks[x].verdict if x in checks else math.nan for x in labels],
                          row_check_note=[checks[x].describe() if x in checks else math.nan for x in labels])


def _plan_disagreements(summary: pd.DataFrame, plan: Plan) -> list[str]:
    """Lines for what the machine profile promised and this run measured otherwise: a verify route whose rows the
    row check found apart (the methods on it are not promised lossless), and a plain decoding the profile ranked
    fastest that this run measured slower than another by more than PLAN_MARGIN (both are marked stale in the
    cached profile, so the next run measures them again)."""
    lines = []
    drafting = summary[~summary["method"].map(is_plain) & (summary["row_check"] == DIFFERS)]
    for note, group in drafting.groupby("row_check_note", sort=False):
        execution = Execution(group["backend"].iloc[0], group["dtype"].iloc[0], group["weights"].iloc[0])
        lines.append(f"{execution.label}: {note} in this machine's row check: losslessness is not promised on this "
                     f"CPU for {', '.join(group['method'])} (the lossless column measures it)")
    if plan.machine is None:
        return lines
    plain = summary[summary["method"].map(is_plain) & summary["dtype"].map(lambda d: isinstance(d, str))]
    rates = {Execution(b, d, w): r for b, d, w, r in zip(plain["backend"], plain["dtype"], plain["weights"],
                                                         plain["tokens_per_s"])}
    ranked = plan.execution.fastest_plain
    if ranked not in rates or len(rates) < 2:
        return lines
    fastest = max(rates, key=rates.get)
    if fastest != ranked and rates[fastest] > PLAN_MARGIN * rates[ranked]:
        lines.append(f"the machine profile ranked {ranked.label} the fastest plain decoding of an answer; this run "
                     f"measured {fastest.label} faster ({rates[fastest]:.1f} against {rates[ranked]:.1f} tok/s, "
                     f"prefill included): both are measured again on the next run")
        mark_stale(plan.machine, [ranked.label, fastest.label])
    return lines


def _why_slower(summary: pd.DataFrame) -> list[str]:
    """One line per method slower than its reference: tokens a step against what a step costs in steps of the
    reference, a plain decoding (a step's time is tau / decode tokens/s; the reference's, one token's)."""
    by_label = summary.set_index("method")
    lines = []
    for _, row in summary.iterrows():
        ref = row["fastest_plain"]
        if not (row["speedup"] < 1) or ref not in by_label.index or row["method"] == ref or pd.isna(row["tau"]) \
                or row["mean_tree_size"] < 1.5:  # plain decoding on a slower execution: the table's row says it all
            continue
        cost = (row["tau"] / row["decode_tokens_per_s"]) * by_label.loc[ref, "decode_tokens_per_s"]
        what = f"a {row['mean_tree_size']:.0f}-row verify" + (f" and {row['draft_ms_per_step']:.1f} ms of drafting"
                                                             if row["draft_ms_per_step"] >= 0.5 else "")
        lines.append(f"{row['method']} is slower than {ref}: it accepted {row['tau']:.2f} tokens a step, and a step "
                     f"({what}) cost {cost:.2f} steps of {ref} here")
    return lines


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
        plain = isinstance(drafter, PlainDrafter)
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
    if machine is not None and execution.own in machine.executions:
        profile = machine.curve(execution.dtype, plan.context, execution.backend, execution.weights)
    else:
        profile = latency_profile(target.model, sizes=tuple(cfg.eval.profile_sizes),
                                  context=int(cfg.eval.profile_context), repeats=cfg.eval.profile_repeats)
    shape = ModelShape.of(target.model)  # the float model's, also under a route that quantises it itself
    weights = None if execution.weights == "fp" else execution.weights  # int4_g32: the bytes the step reads
    bound = _own_graph_bound(hw) if execution.backend in OWN_GRAPH else hw
    profile["roofline_ms"] = [1e3 * roofline_step_time(shape, bound, n, plan.context, dtype=weights)
                              for n in profile["tokens"]]
    profile.to_csv(path, index=False)
    return profile


def _own_graph_bound(hw: HardwareSpec) -> HardwareSpec:
    """hw's roofline for a runtime that runs its own graph (openvino, onnxruntime): hw=cpu's per-layer cost is
    PyTorch's dispatch, measured on an eager model, which such a runtime does not pay; and its kernels multiply at
    their own rate (ONNX Runtime's int4 products take int8 activations), so every dtype gets the fastest multiply
    measured here. With PyTorch's, the roofline of an int4 step lay above the step measured."""
    peaks = hw.figure("peak_tflops")  # measured here (hw=cpu) or the spec's
    return dataclasses.replace(hw, layer_overhead_ms=0.0, peak_tflops=dict.fromkeys(peaks, max(peaks.values())))


def _write(summary: pd.DataFrame, out: Path) -> None:
    summary.to_json(out / "summary.json", orient="records", indent=2)
    flat = summary.copy()
    flat["per_depth_acceptance"] = flat["per_depth_acceptance"].map(lambda r: json.dumps([round(x, 4) for x in r]))
    flat.to_csv(out / "summary.csv", index=False)
