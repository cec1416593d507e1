"""Commit an accepted path into a transformers DynamicCache.

A tree's accepted path is not a prefix of the tree's rows, so `DynamicCache.crop` cannot express it: we gather the
kept positions along the sequence axis of every layer (transformers has no public API for a gather).
"""

from __future__ import annotations

import torch


def commit_path(cache, past_len: int, path: list[int]) -> None:
    """Keep the cache's first past_len entries plus the tree rows listed in path, in that order."""
    n_now = cache.get_seq_length()
    if path == list(range(len(path))):  # a prefix of the rows: cropping is exact and cheaper
        drop = n_now - past_len - len(path)
        if drop:
            cache.crop(-drop)
        return
    index = torch.cat([torch.arange(past_len), past_len + torch.tensor(path, dtype=torch.long)])
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        idx = index.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = layer.keys.shape[-2]


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
