"""Every metric, defined once, computed from records.jsonl rows (one per prompt, turn and method).

tau: decode-phase tokens emitted (new tokens past the prefill's, cut at EOS and max_new_tokens) / target forward
steps, bonus included (AR = 1.00). tokens/s: new tokens / wall time, prefill included (Spec-Bench) and
decode-only; with eval.batch_size > 1, tokens_per_s is per sequence (each until it finished: its latency) and
throughput_tokens_per_s the batch's.

speedup, the headline: Spec-Bench's ratio of means, the method's total new tokens over its total time, divided by
the same for the FASTEST plain decoding OF THE SAME WEIGHTS measured in the run (`fastest_plain`: the weight format the
method verifies with, fp, int8 or int4, on whichever backend and dtype decoded it fastest, so a method that only
beats a slow plain decoding must not look like a win), on the prompts both decoded; speedup_ci_low/high: a 95% paired
bootstrap interval of that ratio (prompts resampled with their pairs kept, scipy's BCa). Every paper, Spec-Bench and
vLLM compare speculation with plain decoding of the same model; a quantised model answers differently, so it is
another axis: speedup_any (with speedup_any_ci_low/high) is the same ratio against the fastest plain decoding of ANY
weights (`fastest_plain_any`), beside the headline (quality.py adds that execution's pass@1 delta where measured), and
speedup_engine (decode_speedup_engine: decode tokens/s alone) against the fastest engine's plain decoding in the run
(`fastest_engine`: llama.cpp, OpenVINO GenAI, ...), what a user would deploy instead.
A mean of per-prompt ratios weighs a short prompt's ratio as much as a long one's and can reverse the verdict
(experiments/headline_speedup), so it is only a secondary column: speedup_mean_of_ratios, beside speedup_geomean (the
geometric mean of the per-prompt ratios). speedup_vs_own_plain: the ratio of means against plain decoding on the run's
own backend and dtype. overhead: mean step latency / mean AR step latency (Medusa). ideal speedup: tau * L(1) / L(n)
with L from the latency profile (or from measured step times when there is none), n the rows verified per forward;
efficiency = decode_speedup / ideal, both without prefill. projected_speedup: tau * T(1) / T(n) from the roofline of
the chosen hw, T(n) the target's forward over n rows plus the drafter's own work (Medusa's heads, a draft model's
forwards). lossless_match: share of prompts whose tokens equal the method's reference plain decoding (same backend
and dtype); eager_match: the same against plain decoding on transformers' eager forward (eval.eager_reference), which
shows a fast backend changes no token. cut_by_context: decoded prompts whose prompt plus max_new_tokens would not fit
the model's context, so their answers may stop early.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy import stats

from specbench.drafters.base import DrafterCost
from specbench.errors import SpecbenchError
from specbench.hardware.measured.machine_profile import busy
from specbench.names import PLAIN

EAGER_REFERENCE = f"{PLAIN}@eager"  # eval.eager_reference: plain decoding on transformers' eager forward


def is_engine(rows: pd.DataFrame) -> bool:
    """Whether these records are an engine's (evaluation/engines.py), which decodes outside the project's loop."""
    return "engine" in rows and rows["engine"].notna().all()


def per_depth_acceptance(rows: pd.DataFrame, max_depth: int = 16) -> list[float]:
    """P(depth d accepted | depth d-1 accepted and that node had children to try), d = 1..

    Conditioning on the accepted node's own children, not on the tree's overall depth: in an unbalanced tree a leaf
    accepted at depth d-1 offered nothing at depth d and must not count as a failure there. An engine's rows give
    none: it reports the tokens each forward gained, never what it drafted, so no rejected depth is seen (every
    depth would read 1.0)."""
    if not len(rows) or is_engine(rows):
        return []
    accepted = np.concatenate([np.asarray(a, dtype=int) - 1 for a in rows["accept_lengths"]])
    if "tried_deeper" in rows:
        tried = np.concatenate([np.asarray(t, dtype=bool) for t in rows["tried_deeper"]])
    else:  # records written before tried_deeper existed: the tree's depth is all they hold
        depths = np.concatenate([np.asarray(d, dtype=int) for d in rows["tree_depths"]])
        tried = depths > accepted
    out = []
    for d in range(1, max_depth + 1):
        eligible = (accepted >= d) | ((accepted == d - 1) & tried)
        if not eligible.any():
            break
        out.append(float((accepted[eligible] >= d).mean()))
    return out


def latency_at(profile: pd.DataFrame | None, n: float) -> float | None:
    """L(n) interpolated from a latency profile with columns tokens, ms."""
    if profile is None or profile.empty:
        return None
    return float(np.interp(n, profile["tokens"], profile["ms"]))


PROVENANCE = ["model", "dtype", "backend", "weights", "hw", "dataset", "cpu_model", "cpu_capability", "threads", "gpu_name", "torch_version",
              "transformers_version", "git_commit", "settings_hash"]


def paired_speedup(grp: pd.DataFrame, ref: pd.DataFrame, seed: int = 0) -> dict:
    """The method's ratio of means over `ref`'s on the (prompt, turn) pairs both decoded, with a 95% paired BCa
    bootstrap interval of that ratio, and the mean and geometric mean of the per-prompt ratios beside it."""
    key = ["question_id", "turn"]
    pairs = grp.set_index(key)[["new_tokens", "wall_time"]].join(
        ref.set_index(key)[["new_tokens", "wall_time"]], rsuffix="_ref", how="inner")
    pairs = pairs[(pairs["wall_time"] > 0) & (pairs["wall_time_ref"] > 0)]
    columns = [pairs[c].to_numpy(dtype=float) for c in ("new_tokens", "wall_time", "new_tokens_ref", "wall_time_ref")]
    ratios = (columns[0] / columns[1]) / (columns[2] / columns[3])
    out = {"speedup": _ratio_of_means(*columns) if len(pairs) else math.nan, "speedup_ci_low": math.nan,
           "speedup_ci_high": math.nan, "paired_prompts": len(pairs),
           "speedup_mean_of_ratios": float(ratios.mean()) if len(ratios) else math.nan,
           "speedup_geomean": float(stats.gmean(ratios)) if len(ratios) and (ratios > 0).all() else math.nan}
    if len(pairs) >= 2 and np.ptp(ratios) == 0:  # every resample gives the same ratio (the reference itself)
        out["speedup_ci_low"] = out["speedup_ci_high"] = out["speedup"]
    elif len(pairs) >= 2:
        with warnings.catch_warnings():  # a degenerate resample set is caught below, not printed per method
            warnings.simplefilter("ignore")
            low, high = stats.bootstrap(columns, _ratio_of_means, paired=True, vectorized=True, confidence_level=0.95,
                                        n_resamples=2000, method="BCa", random_state=seed).confidence_interval
        finite = np.isfinite(low) and np.isfinite(high)
        out["speedup_ci_low"], out["speedup_ci_high"] = (float(low), float(high)) if finite else (math.nan, math.nan)
    return out


def _ratio_of_means(tokens, time, ref_tokens, ref_time, axis=-1):
    """(sum tokens / sum time) / (sum ref_tokens / sum ref_time): Spec-Bench's speedup over a set of prompts."""
    return (np.sum(tokens, axis=axis) / np.sum(time, axis=axis)) / (np.sum(ref_tokens, axis=axis)
                                                                    / np.sum(ref_time, axis=axis))


def decoded(records: pd.DataFrame) -> pd.DataFrame:
    """The records of decoded prompts: skipped ones (no room in the context) are only counted."""
    records = records.assign(turn=records["turn"] if "turn" in records else 0)
    if "skipped" not in records:
        return records
    return records[~records["skipped"].fillna(False).astype(bool)]


def decode_tau(new_tokens, steps: int) -> float:
    """tau over answers: their new tokens past the prefill's (cut at EOS and max_new_tokens) per target forward."""
    return float((np.asarray(new_tokens) - 1).sum() / steps) if steps else math.nan


def summarize(records: pd.DataFrame, latency_profile: pd.DataFrame | None = None,
              projected_step: "callable | None" = None, memory: dict[str, int] | None = None,
              drafter_costs: dict[str, DrafterCost] | None = None, max_context: int | None = None,
              max_new_tokens: int | None = None) -> pd.DataFrame:
    """One row per method. projected_step(n_tokens, context, drafter=DrafterCost) -> seconds from the hardware
    roofline model; memory: each method's measured peak allocation in bytes (evaluation.memory); drafter_costs: the
    work each method's drafter adds to a step (none: the target's forward alone); max_context and max_new_tokens
    count the prompts whose answer the context may have cut (cut_by_context)."""
    kept = decoded(records)
    skipped_by_method = records.drop(kept.index).groupby("method").size().to_dict()
    records = kept
    if records.empty:
        raise SpecbenchError("every prompt was skipped: each is longer than the model's context; give shorter "
                             "prompts or a model with a longer context")
    memory = memory or {}
    base = records[records["method"] == PLAIN]
    plain = records[records["method_name"] == PLAIN] if "method_name" in records else base
    rates = {label: _tokens_per_s(g) for label, g in plain.groupby("method")}
    plain_weights = {label: _weights(g) for label, g in plain.groupby("method")}
    fastest_any = _fastest(rates)
    engine_plain = records[records["engine_mode"] == PLAIN] if "engine_mode" in records else records.iloc[:0]
    engine_rates = {label: _tokens_per_s(g) for label, g in engine_plain.groupby("method")}
    fastest_engine = _fastest(engine_rates)
    base_tps = _tokens_per_s(base)
    base_step = _mean_step(base)
    eager = records[records["method"] == EAGER_REFERENCE]
    rows = []
    for method, grp in records.groupby("method", sort=False):
        engine = is_engine(grp)
        steps = grp["steps"].sum()
        tau = decode_tau(grp["new_tokens"], steps)
        mean_tree = np.mean(np.concatenate([np.asarray(t) for t in grp["tree_sizes"]])) if steps else math.nan
        tps = _tokens_per_s(grp)
        step = _mean_step(grp)
        l1 = latency_at(latency_profile, 1) or _mean_verify(base)
        ln = latency_at(latency_profile, mean_tree) or _mean_verify(grp)
        ideal = tau * l1 / ln if l1 and ln else math.nan
        speedup = tps / base_tps if base_tps else math.nan
        decode_speedup = _decode_tokens_per_s(grp) / _decode_tokens_per_s(base) if len(base) else math.nan
        context = float(np.mean(grp["prompt_len"] + grp["new_tokens"] / 2))
        step_s = _projected_step_s(projected_step, grp, mean_tree, context, (drafter_costs or {}).get(method))
        projected = tau * projected_step(1, context) / step_s if projected_step and steps else math.nan
        rows.append({
            "method": method,
            "num_prompts": len(grp),
            "tau": tau,
            "mean_tree_size": mean_tree,
            "tokens_per_s": tps,
            "throughput_tokens_per_s": _throughput(grp),
            "throughput_speedup": _throughput(grp) / _throughput(base) if len(base) else math.nan,
            "decode_tokens_per_s": _decode_tokens_per_s(grp),
            "speedup_vs_own_plain": speedup,
            "decode_speedup": decode_speedup,
            "overhead": step / base_step if base_step else math.nan,
            "draft_ms_per_step": 1e3 * grp["draft_time"].sum() / steps if steps else math.nan,
            "verify_ms_per_step": 1e3 * grp["verify_time"].sum() / steps if steps else math.nan,
            "translate_ms_per_step": 1e3 * grp["translate_time"].sum() / steps  # tokenizer work inside draft_ms
            if steps and "translate_time" in grp else math.nan,
            "ideal_speedup": ideal,
            "efficiency": decode_speedup / ideal if ideal else math.nan,
            "projected_speedup": projected,
            "projected_tokens_per_s": tau / step_s,
            "framework_ms_per_step": 1e3 * float(np.median(np.concatenate([np.asarray(f) for f in grp["framework_times"]])))
            if steps else math.nan,
            "lossless_match": _lossless_match(grp, _reference(records, grp, base)),
            "lossless_reference": _reference(records, grp, base)["method"].iloc[0] if len(base) else math.nan,
            "eager_match": _lossless_match(grp, eager) if len(eager) else math.nan,
            "drafter_params": int(grp["drafter_params"].iloc[0]),
            # an engine's caches and buffers live in its own runtime, which neither the decoder nor torch's profiler
            # sees: not measured, rather than the 0 MiB a reader would take for a measurement
            "drafter_mb": math.nan if engine else grp["drafter_bytes"].iloc[0] / 2**20,
            "kv_peak_mb": math.nan if engine else grp["kv_peak_bytes"].max() / 2**20,
            "peak_alloc_mb": memory[method] / 2**20 if method in memory and not engine else math.nan,
            "method_mem_mb": (grp["drafter_bytes"].iloc[0] + memory[method]) / 2**20
            if method in memory and not engine else math.nan,
            "lossless_rule": bool(grp["lossless_rule"].iloc[0]),
            "per_depth_acceptance": per_depth_acceptance(grp),
            "skipped_prompts": int(skipped_by_method.get(method, 0)),
            "load_1min_max": grp["load_1min"].max() if "load_1min" in grp else math.nan,  # busy_note
            "cut_by_context": int((grp["prompt_len"] + max_new_tokens > max_context).sum())
            if max_context and max_new_tokens else 0,
            **_headline(grp, plain, base, rates, plain_weights, fastest_any),
            **_against_engine(grp, engine_plain, fastest_engine),
            **_distribution_check(grp, base),
            **{k: grp[k].iloc[0] for k in PROVENANCE if k in grp},
        })
    return pd.DataFrame(rows)


def skipped_note(summary: pd.DataFrame, max_context: int) -> str | None:
    """The line under the printed table for prompts skipped as too long for the context: no column counts them."""
    counts = summary.set_index("method")["skipped_prompts"] if "skipped_prompts" in summary else pd.Series()
    if not counts.any():
        return None
    told = str(counts.max()) if counts.nunique() == 1 else ", ".join(f"{m} {n}" for m, n in counts.items() if n)
    return (f"skipped: {told} prompt(s) with no room to answer in the model's context of {max_context} tokens, left "
            f"out of every column above (skipped_prompts in summary.csv)")


def busy_note(summary: pd.DataFrame) -> str | None:
    """A notice when the load average while decoding shows other work on the CPU (machine_profile.busy's rule):
    then every timing above shared the machine."""
    load, cpus = summary.get("load_1min_max", pd.Series(dtype=float)).max(), os.cpu_count() or 1
    if not busy({"loadavg_1min": [load if pd.notna(load) else 0.0], "cpus": cpus}):
        return None
    return (f"notice: timings were made on a busy machine (1-min load up to {load:.1f} on {cpus} CPUs while "
            f"decoding): other work shared the CPU, so tokens/s and speedups may be off; rerun on a quiet machine")


def _fastest(rates: dict[str, float], weights: dict[str, str] | None = None, of: str | None = None) -> str | None:
    """The label of the fastest plain decoding (of weights `of` when given)."""
    allowed = {label: r for label, r in rates.items() if of is None or weights[label] == of}
    return max(allowed, key=allowed.get) if allowed else None


def _weights(grp: pd.DataFrame) -> str:
    return str(grp["weights"].iloc[0]) if "weights" in grp else "fp"  # records before weights existed: float


def _headline(grp: pd.DataFrame, plain: pd.DataFrame, base: pd.DataFrame, rates: dict[str, float],
              plain_weights: dict[str, str], fastest_any: str | None) -> dict:
    """speedup (and its CI and secondary means) against the fastest plain decoding of the method's own weights, and
    speedup_any against the fastest of any weights; a method whose weights no plain decoding ran is judged against
    the fastest of any."""
    same = _fastest(rates, plain_weights, _weights(grp)) or fastest_any
    against = {label: plain[plain["method"] == label] if label else base for label in (same, fastest_any)}
    anyw = paired_speedup(grp, against[fastest_any])
    return {"fastest_plain": same, **paired_speedup(grp, against[same]), "fastest_plain_any": fastest_any,
            "speedup_any": anyw["speedup"], "speedup_any_ci_low": anyw["speedup_ci_low"],
            "speedup_any_ci_high": anyw["speedup_ci_high"]}


def _against_engine(grp: pd.DataFrame, engine_plain: pd.DataFrame, fastest: str | None) -> dict:
    """speedup_engine (its CI) and decode_speedup_engine: the method against the fastest engine's plain decoding in
    the run (fastest_engine), total and decode-only tokens/s: a speedup over a slow plain step cannot pass as a
    result beside what users deploy. NaN where no engine's plain decoding ran."""
    if fastest is None:
        return {"fastest_engine": math.nan, "speedup_engine": math.nan, "speedup_engine_ci_low": math.nan,
                "speedup_engine_ci_high": math.nan, "decode_speedup_engine": math.nan}
    ref = engine_plain[engine_plain["method"] == fastest]
    paired = paired_speedup(grp, ref)
    return {"fastest_engine": fastest, "speedup_engine": paired["speedup"],
            "speedup_engine_ci_low": paired["speedup_ci_low"], "speedup_engine_ci_high": paired["speedup_ci_high"],
            "decode_speedup_engine": _decode_tokens_per_s(grp) / _decode_tokens_per_s(ref)}


def _distribution_check(grp: pd.DataFrame, base: pd.DataFrame) -> dict:
    """Sampling runs: mean NLL of the emitted tokens under the target's sampling distribution, and a Welch z-score
    of the per-prompt means against plain decoding's. A lossless method draws from the same distribution, so |z| stays
    small; a lossy rule (typical acceptance) shifts it."""
    def per_prompt(g):
        return np.array([-np.mean(lp) for lp in g.get("token_logprobs", []) if len(lp)])

    ours, ref = per_prompt(grp), per_prompt(base)
    if len(ours) < 2 or len(ref) < 2:
        return {"mean_nll": math.nan, "nll_z": math.nan}
    se = math.sqrt(ours.var(ddof=1) / len(ours) + ref.var(ddof=1) / len(ref))
    return {"mean_nll": float(ours.mean()), "nll_z": float((ours.mean() - ref.mean()) / se) if se > 0 else 0.0}


def _projected_step_s(projected_step, grp: pd.DataFrame, mean_tree: float, context: float,
                      cost: DrafterCost | None) -> float:
    """Roofline seconds per step: the target's forward over the mean rows verified (PPD's prompt tokens are rows
    already) plus the drafter's own work. A draft model runs once per level of the tree it drafts, so its forwards
    per step are the step's tree depth, averaged over the steps."""
    if projected_step is None or not grp["steps"].sum():
        return math.nan
    if cost is None or cost.draft is None:
        return projected_step(mean_tree, context, drafter=cost)
    depths, counts = np.unique(np.concatenate([np.asarray(d, dtype=int) for d in grp["tree_depths"]]),
                               return_counts=True)
    return float(sum(c * projected_step(mean_tree, context, drafter=replace(cost, draft_forwards=int(d)))
                     for d, c in zip(depths, counts)) / counts.sum())


def _tokens_per_s(grp: pd.DataFrame) -> float:
    return grp["new_tokens"].sum() / grp["wall_time"].sum() if len(grp) and grp["wall_time"].sum() > 0 else math.nan


def _throughput(grp: pd.DataFrame) -> float:
    """Tokens per second of the machine: with eval.batch_size > 1 the sequences of a batch share its wall time."""
    if "batch_id" not in grp or grp["batch_id"].isna().all():
        return _tokens_per_s(grp)
    batches = grp.dropna(subset=["batch_id"]).drop_duplicates("batch_id")["batch_wall_time"].sum()
    single = grp[grp["batch_id"].isna()]["wall_time"].sum()
    return grp["new_tokens"].sum() / (batches + single)


def _decode_tokens_per_s(grp: pd.DataFrame) -> float:
    return (grp["new_tokens"] - 1).sum() / (grp["wall_time"] - grp["prefill_time"]).sum()


def _mean_step(grp: pd.DataFrame) -> float:
    steps = grp["steps"].sum()
    return (grp["wall_time"] - grp["prefill_time"]).sum() / steps if steps else math.nan


def _mean_verify(grp: pd.DataFrame) -> float:
    steps = grp["steps"].sum()
    return grp["verify_time"].sum() / steps if steps else math.nan


def _reference(records: pd.DataFrame, grp: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """The plain decoding a method must reproduce: its own backbone's (`reference`, Medusa-2) or plain decoding's."""
    ref = grp["reference"].iloc[0] if "reference" in grp else None
    return records[records["method"] == ref] if isinstance(ref, str) else base


def _lossless_match(grp: pd.DataFrame, base: pd.DataFrame) -> float:
    """Share of prompts whose tokens equal plain decoding's; NaN where equality is not the promise (lossy rule or
    sampling: outputs then differ by design and the distribution check applies instead)."""
    if base.empty or not grp["lossless_rule"].iloc[0] or grp["temperature"].iloc[0] > 0:
        return math.nan
    ref = dict(zip(zip(base["question_id"], base["turn"]), base["output_ids"]))
    pairs = [(out, ref[k]) for k, out in zip(zip(grp["question_id"], grp["turn"]), grp["output_ids"]) if k in ref]
    return float(np.mean([a == b for a, b in pairs])) if pairs else math.nan
