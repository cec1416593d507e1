"""Every metric of ARCHITECTURE.md, defined once, computed from records.jsonl rows (one per prompt and method).

tau: decode-phase new tokens / target forward steps, bonus included (AR = 1.00). tokens/s: new tokens / wall time,
prefill included (Spec-Bench) and decode-only. speedup: method tokens/s / baseline tokens/s on the same prompts.
overhead: mean step latency / mean AR step latency (Medusa). ideal speedup: tau * L(1) / L(n) with L from the
latency profile (or from measured step times when there is none); efficiency = speedup / ideal.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

BASELINE = "autoregressive"


def per_depth_acceptance(rows: pd.DataFrame, max_depth: int = 16) -> list[float]:
    """P(depth d accepted | depth d-1 accepted and the tree reached depth d), d = 1.."""
    accepted = np.concatenate([np.asarray(a, dtype=int) - 1 for a in rows["accept_lengths"]]) if len(rows) else []
    depths = np.concatenate([np.asarray(d, dtype=int) for d in rows["tree_depths"]]) if len(rows) else []
    out = []
    for d in range(1, max_depth + 1):
        eligible = (accepted >= d - 1) & (depths >= d)
        if not eligible.any():
            break
        out.append(float((accepted[eligible] >= d).mean()))
    return out


def latency_at(profile: pd.DataFrame | None, n: float) -> float | None:
    """L(n) interpolated from a latency profile with columns tokens, ms."""
    if profile is None or profile.empty:
        return None
    return float(np.interp(n, profile["tokens"], profile["ms"]))


def summarize(records: pd.DataFrame, latency_profile: pd.DataFrame | None = None,
              projected_step: "callable | None" = None) -> pd.DataFrame:
    """One row per method. projected_step(n_tokens, context) -> seconds from the hardware roofline model."""
    base = records[records["method"] == BASELINE]
    base_tps = _tokens_per_s(base)
    base_step = _mean_step(base)
    rows = []
    for method, grp in records.groupby("method", sort=False):
        steps = grp["steps"].sum()
        decode_tokens = sum(sum(a) for a in grp["accept_lengths"])
        tau = decode_tokens / steps if steps else math.nan
        mean_tree = np.mean(np.concatenate([np.asarray(t) for t in grp["tree_sizes"]])) if steps else math.nan
        tps = _tokens_per_s(grp)
        step = _mean_step(grp)
        l1 = latency_at(latency_profile, 1) or _mean_verify(base)
        ln = latency_at(latency_profile, mean_tree) or _mean_verify(grp)
        ideal = tau * l1 / ln if l1 and ln else math.nan
        speedup = tps / base_tps if base_tps else math.nan
        context = float(np.mean(grp["prompt_len"] + grp["new_tokens"] / 2))
        projected = (tau * projected_step(1, context) / projected_step(mean_tree, context)
                     if projected_step and steps else math.nan)
        rows.append({
            "method": method,
            "num_prompts": len(grp),
            "tau": tau,
            "mean_tree_size": mean_tree,
            "tokens_per_s": tps,
            "decode_tokens_per_s": (grp["new_tokens"] - 1).sum() / (grp["wall_time"] - grp["prefill_time"]).sum(),
            "speedup": speedup,
            "overhead": step / base_step if base_step else math.nan,
            "draft_ms_per_step": 1e3 * grp["draft_time"].sum() / steps if steps else math.nan,
            "verify_ms_per_step": 1e3 * grp["verify_time"].sum() / steps if steps else math.nan,
            "ideal_speedup": ideal,
            "efficiency": speedup / ideal if ideal else math.nan,
            "projected_speedup": projected,
            "framework_ms_per_step": 1e3 * float(np.median(np.concatenate([np.asarray(f) for f in grp["framework_times"]])))
            if steps else math.nan,
            "lossless_match": _lossless_match(grp, base),
            "peak_mem_mb": grp["peak_mem_mb"].max(),
            "kv_cache_mb": grp["kv_cache_bytes"].mean() / 2**20,
            "drafter_params": int(grp["drafter_params"].iloc[0]),
            "drafter_mb": grp["drafter_bytes"].iloc[0] / 2**20,
            "lossless_rule": bool(grp["lossless_rule"].iloc[0]),
            "per_depth_acceptance": per_depth_acceptance(grp),
            **_distribution_check(grp, base),
        })
    return pd.DataFrame(rows)


def _distribution_check(grp: pd.DataFrame, base: pd.DataFrame) -> dict:
    """Sampling runs: mean NLL of the emitted tokens under the target's sampling distribution, and a Welch z-score
    of the per-prompt means against the baseline's. A lossless method draws from the same distribution, so |z| stays
    small; a lossy rule (typical acceptance) shifts it."""
    def per_prompt(g):
        return np.array([-np.mean(lp) for lp in g.get("token_logprobs", []) if len(lp)])

    ours, ref = per_prompt(grp), per_prompt(base)
    if len(ours) < 2 or len(ref) < 2:
        return {"mean_nll": math.nan, "nll_z": math.nan}
    se = math.sqrt(ours.var(ddof=1) / len(ours) + ref.var(ddof=1) / len(ref))
    return {"mean_nll": float(ours.mean()), "nll_z": float((ours.mean() - ref.mean()) / se) if se > 0 else 0.0}


def _tokens_per_s(grp: pd.DataFrame) -> float:
    return grp["new_tokens"].sum() / grp["wall_time"].sum() if len(grp) and grp["wall_time"].sum() > 0 else math.nan


def _mean_step(grp: pd.DataFrame) -> float:
    steps = grp["steps"].sum()
    return (grp["wall_time"] - grp["prefill_time"]).sum() / steps if steps else math.nan


def _mean_verify(grp: pd.DataFrame) -> float:
    steps = grp["steps"].sum()
    return grp["verify_time"].sum() / steps if steps else math.nan


def _lossless_match(grp: pd.DataFrame, base: pd.DataFrame) -> float:
    """Share of prompts whose tokens equal the baseline's; NaN where equality is not the promise (lossy rule or
    sampling: outputs then differ by design and the distribution check applies instead)."""
    if base.empty or not grp["lossless_rule"].iloc[0] or grp["temperature"].iloc[0] > 0:
        return math.nan
    ref = dict(zip(base["question_id"], base["output_ids"]))
    pairs = [(out, ref[q]) for q, out in zip(grp["question_id"], grp["output_ids"]) if q in ref]
    return float(np.mean([a == b for a, b in pairs])) if pairs else math.nan
