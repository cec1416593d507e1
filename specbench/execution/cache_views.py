"""A cache whose keys and values live in one buffer a runtime reads in place (OpenVINO's and ONNX Runtime's
forwards): the cache's layers made views of the buffer's leading slots, and the masks and rows such a forward reads
from a call as the methods make it."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def view_layers(cache: DynamicCache, buffer, length: int, layers: int) -> None:
    """`cache`'s layers made views of the first `length` slots of `buffer.memory` (2 x layers, 1, kv heads, capacity,
    head dim); layers a DynamicCache made without a config has not built yet are added, as its update would. One
    slice and one unbind make all the views, where a slice per layer is a visible share of a one-row step
    (experiments/openvino_engine_speed, parity_sdopenvino)."""
    if cache.layer_class_to_replicate is not None:
        cache.layers.extend(cache.layer_class_to_replicate() for _ in range(layers - len(cache.layers)))
    views = buffer.memory[:, :, :, :length].unbind(0)
    for layer, keys, values in zip(cache.layers, views[0::2], views[1::2]):
        if not layer.is_initialized:
            layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values


def layer_tensors(cache: DynamicCache):
    """Every layer's keys and values, in the buffer's order (keys then values, layer by layer)."""
    return (t for layer in cache.layers for t in (layer.keys, layer.values))


def kept_rows(logits_to_keep, n: int) -> torch.Tensor:
    """The rows whose logits a call returns, as transformers' `logits_to_keep`: the last k for an int k (0: all),
    or the given row indices."""
    if isinstance(logits_to_keep, torch.Tensor):
        return logits_to_keep.to(torch.long).reshape(-1)
    return torch.arange(n - logits_to_keep if logits_to_keep else 0, n)


def causal_chain(mask: torch.Tensor, position_ids: torch.Tensor, past: int) -> bool:
    """Whether a call is one sequence's next rows in order, each seeing the cache and the rows before it (a prefill,
    a chain), which can be cut into consecutive pieces or run by any causal forward."""
    batch, _, n, _ = mask.shape
    return (batch == 1 and torch.equal(position_ids, torch.arange(past, past + n)[None])
            and torch.equal(mask, full_mask(None, 1, n, past)))


def full_mask(mask: torch.Tensor | None, batch: int, n: int, past: int) -> torch.Tensor:
    """The 4D boolean mask a runtime's graph takes: a 4D mask as given, else causal over the new rows, with a 2D padding mask
    (batch, past + n) applied to the keys when given."""
    if mask is not None and mask.dim() == 4:
        return mask.to(torch.bool)
    causal = torch.ones(n, past + n, dtype=torch.bool).tril(past)[None, None].expand(batch, 1, n, past + n)
    return causal if mask is None else causal & mask.to(torch.bool)[:, None, None, :]
