"""What a cost model needs of a transformer: its shape and its weights' bytes per parameter.

It lives with the models (below drafters and hardware) because a drafter describes the models it derives by their
shape (drafters/base.py: DrafterCost), and the hardware cost models price those shapes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specbench.errors import SpecbenchError

BYTES_PER = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "w8a8": 1.0, "w8a8s": 1.0, "int4": 0.5}


def bytes_per(dtype: str) -> float:
    """Bytes per parameter of a dtype name (int4: half a byte). int4_g<N>, the grouped int4 of execution/quantize.py,
    adds its 16-bit scale and zero per group of N; int8's one scale per output channel (2 / in_features bytes per
    parameter, under 0.4% for SmolLM2's) is left out."""
    check_dtype(dtype, "dtype")
    group = _int4_group(dtype)
    return BYTES_PER["int4"] + 4 / group if group else BYTES_PER[dtype]


def _int4_group(dtype: str) -> int | None:
    head, _, group = dtype.partition("_g")  # w4a8(r)_g<N>: the same int4 weights, activations quantised on the fly
    return int(group) if head in ("int4", "w4a8", "w4a8r") and group.isdigit() and int(group) > 0 else None


def check_dtype(dtype: str, where: str) -> None:
    if dtype not in BYTES_PER and _int4_group(dtype) is None:
        raise SpecbenchError(f"{where}: dtype '{dtype}' is unknown; valid: {', '.join(BYTES_PER)}, int4_g<group size>, "
                             f"w4a8_g<group size>, w4a8r_g<group size>")


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

    def with_dtype(self, dtype: str) -> ModelShape:
        bytes_per(dtype)  # validates the name
        return dataclasses.replace(self, dtype=dtype)

    @classmethod
    def of(cls, model, dtype: str | None = None) -> ModelShape:
        text = model.config.get_text_config()
        heads = text.num_attention_heads
        names = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}
        formats = {m.weight_format for m in model.modules() if hasattr(m, "weight_format")}  # execution/quantize.py
        return cls(params=sum(p.numel() for p in model.parameters()), layers=text.num_hidden_layers,
                   hidden=text.hidden_size, heads=heads, kv_heads=getattr(text, "num_key_value_heads", heads),
                   head_dim=head_dim(text),
                   intermediate=text.intermediate_size, vocab=text.vocab_size,
                   dtype=dtype or (formats.pop() if len(formats) == 1 else names[str(next(model.parameters()).dtype)]))


def head_dim(config) -> int:
    """Each attention head's width: the config's own, else hidden / heads (Llama-style configs state none)."""
    return getattr(config, "head_dim", None) or config.hidden_size // getattr(config, "num_attention_heads", 1)


def cache_problem(config) -> str | None:
    """Why a route that keeps each layer's keys and values in one growing buffer (the openvino and onnxruntime
    routes: execution/cache_views.py) cannot hold this model's cache, None when it can or the config is unknown: layers
    of another kind than full attention (a sliding window keeps a ring of its last tokens, which such a buffer does
    not)."""
    if config is None:
        return None
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"its layers are {', '.join(sorted(kinds))}, and this route keeps full-attention caches only"
    return None


def linear_input_widths(config) -> list[int]:
    """The input widths of a decoder layer's linears (hidden: q/k/v and gate/up; heads x head width: o; intermediate:
    down): what an int4 group must divide."""
    return sorted({config.hidden_size, config.intermediate_size,
                   getattr(config, "num_attention_heads", 1) * head_dim(config)})


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
