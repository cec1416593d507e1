"""The roofline of a decoding step on any board: one forward's per-op costs (ops.py) summed, or Ghidorah's best
split across a board's units (ghidorah.py); projections of a measured tau onto a board, and SSSD's free budget.
"""

from __future__ import annotations

from specbench.drafters.base import DrafterCost
from specbench.errors import SpecbenchError
from specbench.hardware.modelled.ghidorah import best_split
from specbench.hardware.modelled.ops import board_dtype, roofline_ops, roofs
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.models.shape import ModelShape, bytes_per


def roofline_step_time(shape: ModelShape, hw: HardwareSpec, tokens: float, context: float, batch: int = 1,
                       dtype: str | None = None, tree_nnz: float | None = None,
                       drafter: DrafterCost | None = None) -> float:
    """Seconds for one forward of `tokens` new tokens per sequence over `context` cached ones, `batch` sequences.

    A board with hw.partition megatron or hcmp runs it split across its units (Ghidorah, batch 1), at ARCA's best
    split for that width."""
    if hw.partition != "gpu_only":
        if batch != 1 or tree_nnz is not None or drafter is not None:
            raise SpecbenchError(f"hw.partition='{hw.partition}' models batch-1 target forwards only (Ghidorah); "
                                 f"use hw.partition=gpu_only for batch, tree_nnz or drafter costs")
        return best_split(shape, hw, tokens, context, hw.partition, heads=0, dtype=dtype)[1]
    return float(roofline_ops(shape, hw, tokens, context, batch, dtype, tree_nnz, drafter)["seconds"].sum())


def project(shape: ModelShape, hw: HardwareSpec, tau: float, tree_size: float, context: float = 256,
            batch: int = 1, drafter: DrafterCost | None = None, dtype: str | None = None) -> dict:
    """Projected tokens/s and speedup on `hw` from a locally measured tau and mean tree size, at the board's own
    bytes per parameter (hw.weight_dtype), not the local run's dtype."""
    if tau < 1 or tree_size < 1:
        raise SpecbenchError(f"projection needs tau >= 1 and tree_size >= 1, got tau={tau}, tree_size={tree_size}")
    dtype = board_dtype(shape, hw, dtype)
    ar = roofline_step_time(shape, hw, 1, context, batch, dtype)
    step = roofline_step_time(shape, hw, tree_size, context, batch, dtype, drafter=drafter)
    return {"hw": hw.name, "dtype": dtype, "projected_ar_ms": 1e3 * ar, "projected_step_ms": 1e3 * step,
            "projected_tokens_per_s": batch * tau / step, "projected_ar_tokens_per_s": batch / ar,
            "projected_speedup": tau * ar / step}


def ridge(hw: HardwareSpec, dtype: str) -> float:
    """FLOP per byte where the roofline turns from memory- to compute-bound."""
    peak, bw = roofs(hw, dtype)
    return peak / bw


def sssd_free_budget(shape: ModelShape, hw: HardwareSpec, dtype: str | None = None) -> dict:
    """SSSD Sec. 3.2: the b*s_q at which each linear turns compute-bound, i.e. verification stops being almost free.

    Solves FLOPs:IO(b*s_q) / bytes_per_element = peak / bandwidth with Table 1's ratios:
    Q/K/V/O: 1 / (1/h + 1/(2 b s_q)); MLP: 2 / (1/h_mlp + 1/(b s_q)). inf when the op never gets there."""
    dtype = board_dtype(shape, hw, dtype)
    r, e = ridge(hw, dtype), bytes_per(dtype)
    qkvo = 1 / (2 * (1 / (e * r) - 1 / shape.hidden))
    mlp = 1 / (2 / (e * r) - 1 / shape.intermediate)
    return {"hw": hw.name, "dtype": dtype, "ridge_flop_per_byte": r,
            "qkvo": qkvo if qkvo > 0 else float("inf"), "mlp": mlp if mlp > 0 else float("inf")}
