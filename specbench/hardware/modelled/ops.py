"""Per-op costs of one forward on one processing unit: each op costs max(FLOPs / peak, bytes / bandwidth), plus a
fixed cost per layer.

The ops are SSSD's Table 1 (QKV/O and MLP linears, tree-masked attention) plus the LM head and the drafter's own
work (Medusa heads, draft-model forwards, PPD's prompt-token rows). Summing per-op maxima, not taking one max of
the sums, is what makes verification "almost free" until the linears turn compute-bound (SSSD Sec. 3.2).
Boards split across units (Ghidorah) build on these rows (ghidorah.py); roofline.py prices a whole step on any board.
"""

from __future__ import annotations

import pandas as pd

from specbench.drafters.base import DrafterCost
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.models.shape import ModelShape, bytes_per


def _linear(name: str, rows: float, d_in: int, d_out: int, w_bytes: float, a_bytes: float, count: int = 1) -> dict:
    return {"op": name, "flops": count * 2 * rows * d_in * d_out, "weight_bytes": count * d_in * d_out * w_bytes,
            "bytes": count * (d_in * d_out * w_bytes + rows * (d_in + d_out) * a_bytes)}


def op_costs(shape: ModelShape, tokens: float, context: float, batch: int = 1, dtype: str | None = None,
             tree_nnz: float | None = None) -> pd.DataFrame:
    """FLOPs and bytes per op of one forward of `tokens` rows per sequence over `context` cached ones.

    tree_nnz: nonzeros of the tree mask (sum over nodes of depth + 1) when the tree block is computed sparsely;
    None prices it as the masked dense tokens x tokens block that HF's attention executes."""
    w = bytes_per(dtype or shape.dtype)
    a = max(w, 2.0)  # activations and KV stay 16-bit (or fp32) when weights are quantised
    rows, L = batch * tokens, shape.layers
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    attn_flops = 4 * batch * shape.heads * shape.head_dim * L  # per query x key pair, QK^T and AV
    kv_row = 2 * shape.kv_heads * shape.head_dim * a * L
    nnz = tokens * tokens if tree_nnz is None else tree_nnz
    ops = [
        _linear("qkv_proj", rows, shape.hidden, qkv, w, a, L),
        _linear("o_proj", rows, shape.heads * shape.head_dim, shape.hidden, w, a, L),
        _linear("mlp", rows, shape.hidden, shape.intermediate, w, a, 3 * L),  # gate, up, down: same size
        {"op": "attn_cache", "flops": attn_flops * tokens * context, "weight_bytes": 0.0,
         "bytes": batch * kv_row * context + 2 * rows * shape.heads * shape.head_dim * a * L},  # KV cache, Q, O
        {"op": "attn_tree", "flops": attn_flops * nnz, "weight_bytes": 0.0,
         "bytes": batch * (kv_row * tokens + tokens * tokens * L)},  # new K/V and the bool mask
        _linear("lm_head", rows, shape.hidden, shape.vocab, w, a),
    ]
    return pd.DataFrame(ops)


def drafter_costs(shape: ModelShape, drafter: DrafterCost, tokens: float, context: float, batch: int = 1,
                  dtype: str | None = None) -> pd.DataFrame:
    """The drafter's ops per step, as op_costs rows (PPD's prompt rows are priced inside the target's forward)."""
    w = bytes_per(dtype or shape.dtype)
    a = max(w, 2.0)
    ops = []
    if drafter.medusa_heads:
        k, rows = drafter.medusa_heads, batch * tokens
        ops.append(_linear("medusa_resblocks", rows, shape.hidden, shape.hidden, w, a, k))
        ops.append(_linear("medusa_lm_heads", rows, shape.hidden, shape.vocab, w, a, k))
    if drafter.draft is not None and drafter.draft_forwards:
        draft = drafter.draft if dtype is None else drafter.draft.with_dtype(dtype)
        for step in range(drafter.draft_forwards):
            one = op_costs(draft, 1, context + step, batch)[["flops", "bytes", "weight_bytes"]].sum()
            ops.append({"op": f"draft_forward_{step + 1}", **one.to_dict()})
    return pd.DataFrame(ops, columns=["op", "flops", "weight_bytes", "bytes"])


def compute_dtype(peaks: dict, dtype: str) -> str:
    """The dtype whose peak prices the FLOPs: the weights' own (a measured machine times its int8 and int4 kernels:
    int4_g32 reads int4's), else float16, bfloat16 or float32, the first the spec has (weight-only quantisation
    computes in the activations' dtype)."""
    return next((d for d in (dtype, dtype.partition("_g")[0], "float16", "bfloat16", "float32") if d in peaks), dtype)


def roofs(hw: HardwareSpec, dtype: str) -> tuple[float, float]:
    """(peak FLOP/s, bytes/s) a single-unit forward gets: a board with units decodes on its GPU, which may draw
    less than the whole DRAM bandwidth (Jetson at Ghidorah's clocks); otherwise the device's own figures."""
    if any(u.kind == "gpu" for u in hw.units):
        gpu = hw.unit("gpu")
        return (gpu.peak_flops(compute_dtype(gpu.peak_tflops, dtype)),
                min(gpu.mem_bandwidth_gbs, hw.figure("mem_bandwidth_gbs")) * 1e9)
    return hw.peak_flops(compute_dtype(hw.figure("peak_tflops"), dtype)), hw.figure("mem_bandwidth_gbs") * 1e9


def board_dtype(shape: ModelShape, hw: HardwareSpec, dtype: str | None) -> str:
    """A board runs its own weight dtype; the machine at hand runs the model's."""
    return dtype or hw.weight_dtype or shape.dtype


def roofline_ops(shape: ModelShape, hw: HardwareSpec, tokens: float, context: float, batch: int = 1,
                 dtype: str | None = None, tree_nnz: float | None = None,
                 drafter: DrafterCost | None = None) -> pd.DataFrame:
    """Per-op breakdown: FLOPs, bytes, arithmetic intensity, seconds and which roof bounds it."""
    dtype = board_dtype(shape, hw, dtype)
    rows = tokens + (drafter.prompt_tokens if drafter else 0)
    frame = op_costs(shape, rows, context, batch, dtype, tree_nnz)
    if drafter is not None:
        frame = pd.concat([frame, drafter_costs(shape, drafter, tokens, context, batch, dtype)], ignore_index=True)
    peak, bw = roofs(hw, dtype)
    compute_s, memory_s = frame["flops"] / peak, frame["bytes"] / bw
    frame["intensity"] = frame["flops"] / frame["bytes"]
    frame["seconds"] = compute_s.where(compute_s > memory_s, memory_s)
    frame["bound"] = (compute_s > memory_s).map({True: "compute", False: "memory"})
    overhead = hw.figure("layer_overhead_ms") / 1e3 * (shape.layers + (drafter.draft.layers * drafter.draft_forwards
                                                    if drafter and drafter.draft is not None else 0))
    overhead_row = {"op": "overhead", "flops": 0.0, "weight_bytes": 0.0, "bytes": 0.0, "intensity": 0.0,
                    "seconds": overhead, "bound": "fixed"}
    return pd.concat([frame, pd.DataFrame([overhead_row])], ignore_index=True)
