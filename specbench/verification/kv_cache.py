"""The KV cache a decode runs on, and an accepted path committed into it.

A tree's accepted path is not a prefix of the tree's rows, so `DynamicCache.crop` alone cannot express it: the kept
rows move up into place along the sequence axis of every layer (transformers has no public API for a gather), then
the cache is cropped. A static cache (the graphs backend's SlotCache) commits by index into its own blocks.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specbench.execution.cache_views import BufferLayer
from specbench.execution.graphs import StaticForward
from specbench.execution.static_cache import SlotCache


def new_cache(model):
    """The cache a decode of `model` starts from: its own static cache under the graphs backend (captured forwards
    read it at fixed addresses), else a DynamicCache with every layer up front (a compiled forward sees one cache)."""
    forward = getattr(model, "forward", None)
    if isinstance(forward, StaticForward):
        return forward.new_cache()
    return DynamicCache(config=model.config)


def commit_path(cache, past_len: int, path: list[int]) -> None:
    """Keep the cache's first past_len entries plus the tree rows listed in path, in that order.

    The path's rows are written over the rows after past_len in place, so a commit costs the kept rows, not the whole
    cache: a gather of every position (index_select) would copy the whole cache at every step, and a cache kept in a
    backend's own memory (execution/openvino/) would then have to be copied in again."""
    if isinstance(cache, SlotCache):
        cache.commit(past_len, path)
        return
    keep = past_len + len(path)
    if path != list(range(len(path))):
        index = past_len + torch.tensor(path, dtype=torch.long)
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                continue
            idx = index.to(layer.keys.device)
            layer.keys[..., past_len:keep, :] = layer.keys.index_select(-2, idx)  # gathered first: overlap is safe
            layer.values[..., past_len:keep, :] = layer.values.index_select(-2, idx)
    drop = cache.get_seq_length() - keep
    if drop:
        cache.crop(-drop)


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        if isinstance(layer, BufferLayer):  # sized without the views its keys and values make when read
            total += layer.nbytes()
            continue
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
