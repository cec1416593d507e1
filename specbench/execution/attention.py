"""Which attention kernel a forward runs: transformers' SDPA, its eager attention, or each where this machine runs it
faster (`model.attention=auto`: the key counts where eager wins, measured by hardware/measured/attention.py).

Why: SDPA's CPU kernel in bfloat16 with one query row can cost several times transformers' eager attention (matmul,
softmax, matmul) over a long cache, while over a short one, and again over a very long one (eager's larger buffers
then cost more than its arithmetic saves), SDPA is the faster (experiments/fast_forward). Where they cross depends
on the machine, so auto runs eager in the windows of key counts measured here. It is one attention function
registered with transformers' AttentionInterface (and SDPA's mask function under the same name): no model file is
forked. It dispatches on the number of keys alone, so plain decoding and a tree verify at the same context run the
same kernel.
"""

from __future__ import annotations

import copy
import dataclasses
import sys

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specbench.errors import SpecbenchError
from specbench.models.loading import DTYPES, LoadedModel

ATTENTIONS = ("auto", "sdpa", "eager")
SWITCHED = "specbench_switch"  # the registered name: eager in the model's windows of key counts, SDPA elsewhere
FLOAT64 = "specbench_float64"  # the registered name: the model's attention computed in float64 (row_invariant)
Windows = list[list]  # [[from keys, to keys or None (no end)], ...]: eager runs where from <= keys < to


def check_attention(name: str) -> None:
    if name not in ATTENTIONS:
        raise SpecbenchError(f"model.attention='{name}' is unknown; valid choices: {', '.join(ATTENTIONS)}")


def eager_forward(module: torch.nn.Module):
    """The model file's own eager attention function (every transformers decoder defines one beside its layer)."""
    return sys.modules[type(module).__module__].eager_attention_forward


def additive_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """SDPA's mask (boolean, or None for causal) as the additive one eager attention adds to its scores, built as
    transformers' eager_mask builds it (0 where visible, the dtype's minimum elsewhere)."""
    rows, keys = query.shape[-2], key.shape[-2]
    if mask is None:
        if rows == 1:  # one query row sees every key
            return None
        mask = torch.ones(rows, keys, dtype=torch.bool, device=query.device).tril(keys - rows)[None, None]
    if mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)


def runs_eager(windows: Windows, keys: int) -> bool:
    return any(start <= keys and (stop is None or keys < stop) for start, stop in windows)


def switched_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's eager attention inside its windows for the query's dtype, SDPA elsewhere."""
    if not runs_eager(module.config.eager_windows.get(str(query.dtype).removeprefix("torch."), []), key.shape[-2]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return eager_forward(module)(module, query, key, value, additive_mask(attention_mask, query, key), **kwargs)


AttentionInterface.register(SWITCHED, switched_attention)
AttentionMaskInterface.register(SWITCHED, sdpa_mask)


def float64_attention(module, query, key, value, attention_mask, **kwargs):
    """The attention the model runs (its config's `inner_attention`), computed in float64 and rounded back."""
    inner = module.config.inner_attention
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.double()
    # transformers' own dispatch, as its attention layers look theirs up (eager: the model file's function)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(inner, eager_forward(module))
    out, weights = attend(module, query.double(), key.double(), value.double(), attention_mask, **kwargs)
    return out.to(query.dtype), weights


AttentionInterface.register(FLOAT64, float64_attention)


def row_invariant(model: torch.nn.Module) -> torch.nn.Module:
    """`model`'s attention layers switched, in place, to their own attention computed in float64: a tree verify then
    gives each row the logits its one-token forward gives, bitwise, where the linears are row-invariant (W8A8).

    Why: a tree verify and a one-token forward sum the same q.k and p.v products in other orders (another kernel,
    another blocking; ~1e-8 apart in float32). Float64 sums of float32 products differ between orders by ~1e-16
    relative, which rounds to the same float32 except where a value lies that close to a rounding boundary, about
    one element in 10^9 (experiments/w8a8_same_model). Not a guarantee by construction (gathering each row's keys
    into its plain-decoding order is, but costs a tree verify far more): the run's lossless column checks every
    answer. The mask is still built for the model's own attention (the model-level config is untouched); only the
    layers' configs are copies.
    Call it on a view whose attention modules are its own (with_weights makes one): a shared module would switch the
    original model too."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if type(module).__name__.endswith("Attention") and config is not None:
            module.config = copy.copy(config)
            module.config.inner_attention = config._attn_implementation
            module.config._attn_implementation = FLOAT64
    return model


def with_attention(target: LoadedModel, attention: str, windows: dict[str, Windows] | None = None) -> LoadedModel:
    """target with its attention set in place (every view and cast copy made later shares it): 'sdpa', 'eager', or
    'auto' with `windows`: per dtype name, the key counts where eager runs.

    'eager' is the switch with one window over every key count, not transformers' own 'eager': that adds a 4D mask
    to the scores as it is given, so a boolean tree mask would come out as +1/0 and every tree verify would be wrong;
    the switch makes the mask additive first."""
    check_attention(attention)
    if attention == "sdpa":
        target.model.set_attn_implementation("sdpa")
        return dataclasses.replace(target, attention=attention)
    if attention == "eager":
        windows = {dtype: [[0, None]] for dtype in DTYPES}
    elif windows is None:
        raise SpecbenchError("model.attention=auto needs the measured eager windows "
                             "(hardware.measured.attention.eager_windows)")
    target.model.config.eager_windows = {d: [list(w) for w in ws] for d, ws in windows.items()}
    target.model.set_attn_implementation(SWITCHED)
    return dataclasses.replace(target, attention=attention)


def attention_tag(target: LoadedModel) -> str:
    """What target's attention runs, for run settings and profile names: 'sdpa', 'eager', or each dtype's eager
    windows ('bfloat16_eager384-1536'); auto that never switches is 'sdpa', as it runs."""
    if target.attention != "auto":
        return target.attention
    windows = target.model.config.eager_windows
    return ",".join(f"{d}_eager" + "+".join(f"{a}-{'' if b is None else b}" for a, b in w)
                    for d, w in sorted(windows.items()) if w) or "sdpa"
