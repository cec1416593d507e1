"""Ghidorah, simulated: one Medusa verify step split across the units of a unified-memory board.

Partitions (hw.partition): `gpu_only` runs every op on the GPU; `megatron` splits linears column-then-row and
attention by heads, with an all-reduce (extra DRAM traffic) after o_proj and the MLP; `hcmp` splits every linear by
output columns (no all-reduce) and attention into the dense KV-cache part (GPU) and the sparse tree part (CPU).
Each unit prices its share with its own roofline; units running at once contend for the shared DRAM bandwidth.
ARCA picks, per width W, the split ratio that minimises T(W), then the W maximising tau(W) / T(W).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.drafters.base import DrafterCost
from specbench.errors import SpecbenchError
from specbench.hardware.modelled.ops import board_dtype, compute_dtype, drafter_costs, op_costs
from specbench.hardware.modelled.spec import PARTITIONS, HardwareSpec, ProcessingUnit
from specbench.models.shape import ModelShape

# Ghidorah Table I: acceptance length per verification width (Medusa Vicuna-7B; calibrated on MT-Bench).
# Reconstructed in ../shared/design/methods-ghidorah-llmcad.md A6.
GHIDORAH_TAU = {
    "mt_bench": {1: 1.0, 2: 1.72, 4: 2.28, 8: 2.59, 16: 2.93, 32: 3.19, 64: 3.34},
    "gsm8k": {1: 1.0, 2: 1.76, 4: 2.43, 8: 2.69, 16: 3.08, 32: 3.34, 64: 3.56},
    "mbpp": {1: 1.0, 2: 1.78, 4: 2.54, 8: 2.89, 16: 3.27, 32: 3.55, 64: 3.74},
    "humaneval": {1: 1.0, 2: 1.77, 4: 2.49, 8: 2.8, 16: 3.19, 32: 3.48, 64: 3.71},
}
LINEARS = ("qkv_proj", "o_proj", "mlp", "lm_head", "medusa_resblocks", "medusa_lm_heads")
# Cross-unit synchronisations per layer. megatron: two all-reduces (after o_proj and the MLP), each a barrier before
# the sum and one after it; hcmp: one barrier after qkv, attention, o_proj, gate/up and down, since each next op
# reads what both units wrote.
SYNCS_PER_LAYER = {"gpu_only": 0, "megatron": 4, "hcmp": 5}


def _time(unit: ProcessingUnit, flops: float, nbytes: float, dtype: str, bw_scale: float) -> float:
    peak = unit.peak_flops(compute_dtype(unit.peak_tflops, dtype))
    return max(flops / peak, nbytes / (unit.mem_bandwidth_gbs * 1e9 * bw_scale))


def medusa_tree_nnz(width: int, depth: int = 4) -> float:
    """Tree-mask nonzeros of a width-W Medusa tree: each node attends to itself and its ancestors (<= depth)."""
    return float(width * min(width, depth + 1))


RATIOS = np.linspace(0, 1, 101)  # ARCA's grid over the CPU's share of the split work


def best_split(shape: ModelShape, hw: HardwareSpec, width: float, context: float, partition: str, heads: int = 4,
               dtype: str | None = None, ratios=RATIOS) -> tuple[float, float]:
    """(CPU share, seconds) of the fastest split of one verify step over `ratios` (ARCA's partition search)."""
    if partition not in PARTITIONS:
        raise SpecbenchError(f"hw.partition='{partition}' is unknown; valid: {', '.join(PARTITIONS)}")
    dtype = board_dtype(shape, hw, dtype)
    gpu, cpu = hw.unit("gpu"), hw.unit("cpu") if partition != "gpu_only" else None
    ops = pd.concat([op_costs(shape, width, context, 1, dtype, medusa_tree_nnz(width)),
                     drafter_costs(shape, DrafterCost(medusa_heads=heads), width, context, 1, dtype)],
                    ignore_index=True).set_index("op")
    fixed = shape.layers * (hw.figure("layer_overhead_ms") / 1e3 + SYNCS_PER_LAYER[partition] * hw.sync_ms / 1e3)
    if partition == "gpu_only":
        alone = min(1.0, hw.figure("mem_bandwidth_gbs") / gpu.mem_bandwidth_gbs)
        return 0.0, fixed + sum(_time(gpu, o.flops, o.bytes, dtype, alone) for o in ops.itertuples())
    both = min(1.0, hw.figure("mem_bandwidth_gbs") / (gpu.mem_bandwidth_gbs + cpu.mem_bandwidth_gbs))  # contention
    linears = ops.loc[[op for op in ops.index if op in LINEARS]]
    cache, tree = ops.loc["attn_cache"], ops.loc["attn_tree"]

    def split(flops, nbytes, r):
        return max(_time(gpu, (1 - r) * flops, (1 - r) * nbytes, dtype, both),
                   _time(cpu, r * flops, r * nbytes, dtype, both))

    def total(r: float) -> float:
        t = sum(split(o.flops, o.bytes, r) for o in linears.itertuples())
        if partition == "hcmp":  # dense KV-cache part on the GPU, sparse tree part on the CPU, at the same time
            return t + max(_time(gpu, cache.flops, cache.bytes, dtype, both),
                           _time(cpu, tree.flops, tree.bytes, dtype, both))
        # megatron: heads split; the tree block is computed densely (W x W) on both units
        dense_tree = tree.flops * width * width / medusa_tree_nnz(width)
        act = 4.0 if dtype == "float32" else 2.0  # activations stay 16-bit under quantised weights
        allreduce_bytes = 2 * shape.layers * 3 * width * shape.hidden * act  # read both partials, write the sum
        return (t + split(cache.flops + dense_tree, cache.bytes + tree.bytes, r)
                + allreduce_bytes / (hw.figure("mem_bandwidth_gbs") * 1e9))

    times = [total(r) for r in ratios]
    best = int(np.argmin(times))
    return float(ratios[best]), fixed + times[best]


def arca_search(shape: ModelShape, hw: HardwareSpec, tau: dict[int, float], context: float = 256,
                partitions=PARTITIONS, heads: int = 4) -> pd.DataFrame:
    """Per partition and width: the split ratio minimising T(W), T(W), tau(W) and tau(W)/T(W)."""
    if not tau or min(tau) < 1 or max(tau) > 64:
        raise SpecbenchError(f"tau needs widths in 1..64 with their acceptance lengths, got {tau}")
    rows = []
    for partition in partitions:
        for width in sorted(tau):
            ratio, seconds = best_split(shape, hw, width, context, partition, heads)
            rows.append({"partition": partition, "width": width, "cpu_ratio": ratio, "step_ms": 1e3 * seconds,
                         "tau": tau[width], "tokens_per_s": tau[width] / seconds})
    return pd.DataFrame(rows)


def speedup_split(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per partition, ARCA's width W* and its speedup over sequential GPU decoding (gpu_only, W=1), split as
    algorithmic tau(W*) x verify cost T_seq / T_gpu_only(W*) x parallel T_gpu_only(W*) / T_partition(W*)."""
    gpu = sweep[sweep["partition"] == "gpu_only"].set_index("width")
    if 1 not in gpu.index:
        raise SpecbenchError("the speedup split needs gpu_only at width 1 (sequential decoding) in the sweep")
    t_seq = gpu.at[1, "step_ms"]
    rows = []
    for partition, grp in sweep.groupby("partition", sort=False):
        best = grp.loc[grp["tokens_per_s"].idxmax()]
        w = int(best["width"])
        rows.append({"partition": partition, "best_width": w, "cpu_ratio": best["cpu_ratio"],
                     "step_ms": best["step_ms"], "tokens_per_s": best["tokens_per_s"],
                     "algorithmic": best["tau"], "verify_cost": t_seq / gpu.at[w, "step_ms"],
                     "parallel": gpu.at[w, "step_ms"] / best["step_ms"],
                     "speedup": best["tau"] * t_seq / best["step_ms"]})
    return pd.DataFrame(rows)
