"""The attentions the exported forward traces, registered with transformers' AttentionInterface (no model file
forked): `split_attention` reads the cached keys where they lie and the new rows as a second block; `recent_attention`
(w4a8r) sums in an order fixed by each query row's position, with `window_inputs` the host side that builds its
window; `prefill_attention` attends a prompt's rows to each other alone. A new layout changes its registered name,
which keys the IR cache (export.ir_folder)."""

from __future__ import annotations

import torch
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

# the registered names, which also key the IR cache: a new IR layout (its attention, inputs or outputs) takes a new one
ATTENTION = "specbench_split_v2"
ROW_INVARIANT_ATTENTION = "specbench_recent_v2"
PREFILL_ATTENTION = "specbench_prefill_v1"
# recent_attention's window: a row at position P reads the keys below b(P) = floor((P - RECENT_DEPTH) / RECENT_STRIDE)
# * RECENT_STRIDE from the cache as it lies and those from b(P) to P gathered in a block of RECENT_WINDOW slots; a call
# may hold rows at most RECENT_DEPTH positions past its cache (a longer chain runs in pieces; a prefill, in one call of
# the prefill IR: route.with_openvino says why)
RECENT_STRIDE, RECENT_DEPTH = 8, 16
RECENT_WINDOW = RECENT_STRIDE + RECENT_DEPTH
RECENT_INPUTS = ("recent_cache_slot", "recent_new_row", "recent_is_new", "recent_mask")


def register(layout: str) -> None:
    """Register `layout`'s attention with transformers, so a model whose config names it runs it."""
    attentions = {ROW_INVARIANT_ATTENTION: recent_attention, PREFILL_ATTENTION: prefill_attention}
    AttentionInterface.register(layout, attentions.get(layout, split_attention))
    AttentionMaskInterface.register(layout, sdpa_mask)  # a 4D mask goes through as given; sdpa's for any other


def split_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cached_kv=(), **_):
    """Attention over the cached keys and the new rows as two blocks, for the exported graph: query (batch, heads, n,
    dim), key and value the new rows only (batch, kv heads, n, dim), `cached_kv` every layer's cached keys and values,
    `attention_mask` the 4D boolean mask over cached + new keys. transformers' SDPA sees the cache concatenated with the
    new rows, which OpenVINO's CPU plugin copies whole on every call (its Concat runs the reference kernel), and its
    grouped-query form goes in as a 5D SDPA the plugin takes apart into a Transpose of the whole cache and two MatMuls
    (experiments/openvino_same_model). Here each key/value head's queries are one matrix against the cache as it lies,
    the new rows a second small block: nothing is copied and no head is repeated."""
    cached_k, cached_v = cached_kv[2 * module.layer_idx], cached_kv[2 * module.layer_idx + 1]
    batch, heads, n, dim = query.shape
    scaling = dim ** -0.5 if scaling is None else scaling  # SDPA's default, as transformers' sdpa_attention_forward
    kv_heads, groups, past = key.shape[1], heads // key.shape[1], cached_k.shape[2]
    q = query.reshape(batch, kv_heads, groups * n, dim)  # query head h reads key head h // groups, as repeat_kv
    scores = torch.cat([q @ cached_k.transpose(-1, -2), q @ key.transpose(-1, -2)], -1) * scaling
    mask = attention_mask.to(torch.bool).repeat(1, 1, groups, 1)  # row g * n + i is row i's mask
    probs = torch.where(mask, scores, torch.finfo(scores.dtype).min).softmax(-1)
    out = probs[..., :past] @ cached_v + probs[..., past:] @ value
    return out.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None


def prefill_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """Attention of a call on an empty cache (a prompt) over its own rows, as one SDPA: query (batch, heads, n, dim),
    key and value the new rows (batch, kv heads, n, dim), `attention_mask` the 4D boolean mask over them. OpenVINO's
    CPU plugin runs it as one fused kernel per layer where split_attention's MatMuls and softmax write every row's
    scores out; the key and value heads repeated for the grouped queries (as repeat_kv) and the mask given, not
    is_causal, are the forms it fuses and runs fastest (experiments/openvino_engine_speed)."""
    batch, kv_heads, n, dim = key.shape
    groups = query.shape[1] // kv_heads
    key, value = (t[:, :, None].expand(batch, kv_heads, groups, n, dim).reshape(batch, kv_heads * groups, n, dim)
                  for t in (key, value))
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attention_mask.to(torch.bool),
                                                           scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def recent_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cached_kv=(), recent=(),
                     **_):
    """Attention whose sums run in an order fixed by the query row's position (w4a8r): a row at position P reads the
    cached keys below b(P) where they lie (`attention_mask`, batch 1, 1, n, cached slots: the host masks the slots
    from b(P) on) and the keys from b(P) to P in a block of its own, slot P' - b(P) holding position P' whether that
    key is cached or a new row of the call (`recent`: per row and slot, the cache slot, the new row, which of the two,
    and whether it is seen). Plain decoding and a tree verify thus add the same numbers in the same places for the
    same row. query (batch, heads, n, dim), key and value the new rows only."""
    cached_k, cached_v = cached_kv[2 * module.layer_idx], cached_kv[2 * module.layer_idx + 1]
    slot, row, is_new, seen = recent
    batch, heads, n, dim = query.shape
    scaling = dim ** -0.5 if scaling is None else scaling
    kv_heads, width, window = key.shape[1], cached_k.shape[2], slot.shape[1]
    groups = heads // kv_heads

    def block(cached, new):  # (batch, kv heads, n, window, dim): each row's recent keys or values
        from_cache = torch.index_select(cached, 2, slot.reshape(-1)).reshape(batch, kv_heads, n, window, dim)
        from_new = torch.index_select(new, 2, row.reshape(-1)).reshape(batch, kv_heads, n, window, dim)
        return torch.where(is_new[None, None, :, :, None], from_new, from_cache)

    recent_k, recent_v = block(cached_k, key), block(cached_v, value)
    q = query.reshape(batch, kv_heads, groups * n, dim)  # query head h reads key head h // groups, as repeat_kv
    cached_scores = (q @ cached_k.transpose(-1, -2)).reshape(batch, kv_heads, groups, n, width)
    per_row = query.reshape(batch, kv_heads, groups, n, dim).transpose(2, 3)  # (batch, kv heads, n, groups, dim)
    recent_scores = (per_row @ recent_k.transpose(-1, -2)).transpose(2, 3)
    scores = torch.cat([cached_scores, recent_scores], -1) * scaling
    mask = torch.cat([attention_mask.to(torch.bool)[:, :, None].expand(batch, kv_heads, groups, n, width),
                      seen[None, None, None].expand(batch, kv_heads, groups, n, window)], -1)
    probs = torch.where(mask, scores, torch.finfo(scores.dtype).min).softmax(-1)
    out = probs[..., :width].reshape(batch, kv_heads, groups * n, width) @ cached_v
    out = out + (probs[..., width:].transpose(2, 3) @ recent_v).transpose(2, 3).reshape(batch, kv_heads, groups * n, dim)
    return out.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None


def window_inputs(mask: torch.Tensor, position_ids: torch.Tensor, past: int, padded: int) -> tuple[torch.Tensor, ...]:
    """recent_attention's inputs for a batch-1 call: the mask over the cache slots below each row's b(P), and per row
    and window slot (position b(P) + slot) the cache slot, the new row, whether the key is a new row's and whether the
    row sees it. `mask` is (1, 1, rows, past + rows), keys cached at slot = position (a committed cache)."""
    seen, positions = mask[0, 0], position_ids[0]
    rows = seen.shape[0]
    start = (positions - RECENT_DEPTH).clamp(min=0) // RECENT_STRIDE * RECENT_STRIDE
    cached = torch.zeros(rows, padded, dtype=torch.bool)
    cached[:, :past] = seen[:, :past] & (torch.arange(past) < start[:, None])
    window = start[:, None] + torch.arange(RECENT_WINDOW)
    is_new = window >= past
    match = seen[:, None, past:] & (positions[None, None] == window[..., None])  # row, slot, new row
    slot = torch.where(is_new, 0, window)
    seen_cached = seen[:, :past].gather(1, slot.clamp(max=past - 1)) if past else torch.zeros_like(is_new)
    return (cached[None, None], slot, match.to(torch.uint8).argmax(-1), is_new,
            torch.where(is_new, match.any(-1), seen_cached))
