"""Commit an accepted path into a transformers DynamicCache.

A tree's accepted path is not a prefix of the tree's rows, so `DynamicCache.crop` alone cannot express it: the kept
rows move up into place along the sequence axis of every layer (transformers has no public API for a gather), then
the cache is cropped.
"""

from __future__ import annotations

import torch


def commit_path(cache, past_len: int, path: list[int]) -> None:
    """Keep the cache's first past_len entries plus the tree rows listed in path, in that order.

    The path's rows are written over the rows after past_len in place, so a commit costs the kept rows, not the whole
    cache: a gather of every position (index_select) copied the whole cache at every step (11.5 MB for SmolLM2 at
    250 tokens), and a cache kept in a backend's own memory (execution/openvino/) then had to be copied in again."""
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
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
