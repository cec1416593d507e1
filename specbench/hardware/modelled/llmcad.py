"""LLMCad's memory budget, modelled: a target that does not fit streams its weights from storage every forward.

The draft stays resident; the target keeps what fits beside it (and both KV caches) and loads the rest per forward
at the board's storage bandwidth. Speculation divides the number of target forwards (so of loads) by tau; LLMCad's
pipeline also hides the draft's forwards under the next load (compute never overlaps compute).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.hardware.modelled.ops import board_dtype
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.models.shape import ModelShape


def _kv_bytes(shape: ModelShape, context: float, dtype_bytes: float) -> float:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes * context


def streaming_latency(target: ModelShape, draft: ModelShape, hw: HardwareSpec, tau: float, draft_len: int,
                      context: float = 256, dtype: str | None = None) -> pd.DataFrame:
    """Per-token latency of plain decoding and of speculation (without and with LLMCad's overlap) when the target
    may occupy hw.memory_gb (LLMCad's memory budget: give hw.memory_gb=4 for a 4 GB budget on an 8 GB board), at the
    board's weight dtype."""
    if tau < 1 or draft_len < 1:
        raise SpecbenchError(f"LLMCad's model needs tau >= 1 and draft_len >= 1; got tau={tau}, draft_len={draft_len}")
    dtype = board_dtype(target, hw, dtype)
    target, draft = target.with_dtype(dtype), draft.with_dtype(dtype)
    budget = hw.figure("memory_gb") * 1e9
    act = 4.0 if dtype == "float32" else 2.0
    kv = _kv_bytes(target, context + draft_len, act) + _kv_bytes(draft, context + draft_len, act)
    resident = budget - draft.weight_bytes - kv
    if resident < 0:
        raise SpecbenchError(f"the draft ({draft.weight_bytes / 1e9:.2f} GB in {dtype}) and KV caches do not fit "
                             f"in a {budget / 1e9:.1f} GB budget on {hw.name}")
    streamed = max(0.0, target.weight_bytes - resident)
    load = streamed / (hw.storage_bandwidth_gbs * 1e9)
    t1 = roofline_step_time(target, hw, 1, context, dtype=dtype)
    verify = roofline_step_time(target, hw, draft_len + 1, context, dtype=dtype)
    drafting = draft_len * roofline_step_time(draft, hw, 1, context, dtype=dtype)
    rows = [("target alone, no budget (if it fit)", t1, 1.0),
            ("plain decoding, streaming", load + t1, 1.0),
            ("speculative, streaming", drafting + load + verify, tau),
            ("speculative, streaming, drafting during loads (LLMCad)", max(drafting, load) + verify, tau)]
    frame = pd.DataFrame([{"scenario": s, "step_ms": 1e3 * t, "tokens_per_step": k, "per_token_ms": 1e3 * t / k}
                          for s, t, k in rows])
    frame["speedup_vs_streaming"] = frame["per_token_ms"].iloc[1] / frame["per_token_ms"]
    frame.attrs = {"dtype": dtype, "memory_gb": budget / 1e9, "streamed_gb": streamed / 1e9,
                   "target_gb": target.weight_bytes / 1e9, "draft_gb": draft.weight_bytes / 1e9,
                   "load_ms": 1e3 * load}
    return frame


def project_llmcad(row: Mapping, hw: HardwareSpec, target: ModelShape, draft: ModelShape, context: float = 256,
                   dtype: str | None = None) -> dict[str, float]:
    """projected_* columns for one summary row (its tau and mean_tree_size) when hw.memory_gb, the memory budget,
    cannot hold the target's weights at the board's dtype; {} when it can. A row without drafts (plain)
    gets plain streaming decoding. The draft forwards per step are taken as mean_tree_size - 1: exact for a chain,
    an upper bound for a tree (one forward can add several branches)."""
    tau, tree_size = float(row["tau"]), float(row["mean_tree_size"])
    frame = streaming_latency(target, draft, hw, max(tau, 1.0), max(tree_size - 1, 1.0), context, dtype)
    if frame.attrs["streamed_gb"] == 0:
        return {}
    per_token = frame["per_token_ms"].tolist()  # no budget, plain streaming, speculative, speculative + overlap
    drafted = tree_size > 1
    stream, overlap = (per_token[2], per_token[3]) if drafted else (per_token[1], per_token[1])
    return {"projected_memory_gb": frame.attrs["memory_gb"], "projected_streamed_gb": frame.attrs["streamed_gb"],
            "projected_target_calls_per_token": 1 / tau if tau > 0 else math.nan,
            "projected_ar_streaming_ms_per_token": per_token[1],
            "projected_streaming_ms_per_token": stream, "projected_overlap_ms_per_token": overlap,
            "projected_streaming_speedup": per_token[1] / stream, "projected_overlap_speedup": per_token[1] / overlap}
