"""Roofline step time of one target forward: max(FLOPs / peak, bytes / bandwidth) + a fixed launch overhead.

Bytes are the weights (read once per forward whatever the token count) plus the KV cache read by attention;
FLOPs are 2 * params per token plus attention's score and value products. This is the model SSSD and Medusa use
to explain when verifying n tokens costs about as much as one.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.hardware.spec import HardwareSpec


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0

    @classmethod
    def of(cls, model, bytes_per_param: float | None = None) -> "ModelShape":
        cfg = model.config
        text = getattr(cfg, "text_config", None) or cfg
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        param = next(model.parameters())
        return cls(params=sum(p.numel() for p in model.parameters()), layers=text.num_hidden_layers,
                   hidden=text.hidden_size, kv_heads=getattr(text, "num_key_value_heads", heads), head_dim=head_dim,
                   bytes_per_param=bytes_per_param or param.element_size())


def roofline_step_time(shape: ModelShape, hw: HardwareSpec, tokens: float, context: float, batch: int = 1) -> float:
    """Seconds for one forward of `tokens` new tokens per sequence over `context` cached ones, `batch` sequences."""
    n = tokens * batch
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * shape.bytes_per_param
    flops = 2 * shape.params * n + 4 * shape.layers * shape.hidden * n * (context + tokens)
    bytes_moved = shape.params * shape.bytes_per_param + batch * kv_per_token * (context + tokens)
    return max(flops / (hw.peak_tflops * 1e12), bytes_moved / (hw.mem_bandwidth_gbs * 1e9)) + hw.launch_overhead_ms / 1e3


def optimal_tokens(shape: ModelShape, hw: HardwareSpec, context: float, batch: int = 1) -> float:
    """Where the roofline turns from memory- to compute-bound: the 'free' verification width per sequence."""
    bytes_fixed = shape.params * shape.bytes_per_param
    return max(1.0, bytes_fixed / (hw.mem_bandwidth_gbs * 1e9) * hw.peak_tflops * 1e12 / (2 * shape.params) / batch)
