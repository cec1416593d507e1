"""Per-op roofline of one forward: each op costs max(FLOPs / peak, bytes / bandwidth), plus a fixed cost per layer.

The ops are SSSD's Table 1 (QKV/O and MLP linears, tree-masked attention) plus the LM head and the drafter's own
work (Medusa heads, draft-model forwards, PPD's prompt-token rows). Summing per-op maxima, not taking one max of
the sums, is what makes verification "almost free" until the linears turn compute-bound (SSSD Sec. 3.2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.hardware.spec import HardwareSpec, bytes_per


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a decoder-only transformer (Llama-style: SwiGLU MLP, GQA)."""

    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str = "bfloat16"  # the weights' dtype; a board's weight_dtype overrides it in projections

    @property
    def weight_bytes(self) -> float:
        return self.params * bytes_per(self.dtype)

    def with_dtype(self, dtype: str) -> "ModelShape":
        bytes_per(dtype)  # validates the name
        return dataclasses.replace(self, dtype=dtype)

    @classmethod
    def of(cls, model, dtype: str | None = None) -> "ModelShape":
        text = model.config.get_text_config()
        heads = text.num_attention_heads
        names = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}
        return cls(params=sum(p.numel() for p in model.parameters()), layers=text.num_hidden_layers,
                   hidden=text.hidden_size, heads=heads, kv_heads=getattr(text, "num_key_value_heads", heads),
                   head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
                   intermediate=text.intermediate_size, vocab=text.vocab_size,
                   dtype=dtype or names[str(next(model.parameters()).dtype)])


# Named shapes, from each model's config.json on the Hugging Face hub (parameter counts include the embeddings).
SHAPES = {
    "llama2_7b": ModelShape(6_738_415_616, 32, 4096, 32, 32, 128, 11008, 32000, "float16"),  # = Vicuna-7B
    "llama2_13b": ModelShape(13_015_864_320, 40, 5120, 40, 40, 128, 13824, 32000, "float16"),
    "tinyllama_1.1b": ModelShape(1_100_048_384, 22, 2048, 32, 4, 64, 5632, 32000, "float16"),
    "smollm2_135m": ModelShape(134_515_008, 30, 576, 9, 3, 64, 1536, 49152, "bfloat16"),
}


def named_shape(name: str) -> ModelShape:
    if name not in SHAPES:
        raise SpecbenchError(f"model shape '{name}' is unknown; valid: {', '.join(SHAPES)}")
    return SHAPES[name]


@dataclass(frozen=True)
class DrafterCost:
    """The drafter's own work per step. Medusa: heads on the verified rows; draft model: sequential forwards of a
    smaller model; PPD: prompt-token rows appended to the target's forward (priced as extra rows)."""

    medusa_heads: int = 0  # each: a ResBlock (h x h) and an LM-head projection (h x vocab), read per step
    draft: ModelShape | None = None
    draft_forwards: int = 0
    prompt_tokens: int = 0


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
    """The dtype whose peak prices the FLOPs: the weights' own, else float16 (weight-only quantisation)."""
    return dtype if dtype in peaks else "float16"


def roofs(hw: HardwareSpec, dtype: str) -> tuple[float, float]:
    """(peak FLOP/s, bytes/s) a single-unit forward gets: a board with units decodes on its GPU, which may draw
    less than the whole DRAM bandwidth (Jetson at Ghidorah's clocks); otherwise the device's own figures."""
    if any(u.kind == "gpu" for u in hw.units):
        gpu = hw.unit("gpu")
        return (gpu.peak_flops(compute_dtype(gpu.peak_tflops, dtype)),
                min(gpu.mem_bandwidth_gbs, hw.bandwidth_gbs) * 1e9)
    return hw.peak_flops(compute_dtype(hw.peaks, dtype)), hw.bandwidth_gbs * 1e9


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
    overhead = hw.layer_overhead * (shape.layers + (drafter.draft.layers * drafter.draft_forwards
                                                    if drafter and drafter.draft is not None else 0))
    overhead_row = {"op": "overhead", "flops": 0.0, "weight_bytes": 0.0, "bytes": 0.0, "intensity": 0.0,
                    "seconds": overhead, "bound": "fixed"}
    return pd.concat([frame, pd.DataFrame([overhead_row])], ignore_index=True)


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
        from specbench.hardware.ghidorah import best_split  # ghidorah builds on this module's op costs

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
