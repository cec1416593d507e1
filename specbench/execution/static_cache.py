"""A preallocated KV cache that a forward writes into at given slots, and an accepted path committed into by index.

The graphs backend (execution/graphs.py) replays captured forwards, which must find their cache at the same addresses
every time: the cache is allocated once, one block for the keys of every layer and one for the values, and a forward
writes its n new rows at the slots the cache names (`slots`, an input of the captured graph). Every layer attends over
the whole block; the 4D mask hides the slots past the committed ones, which only ever hold finite values (zeros, or
rows of a rejected draft), so their zero attention weight stays exactly zero.

Why not transformers' StaticCache as it is: its layers append at a device-side counter (`cumulative_length`), so
every read of the cache's length is a device sync, every crop is a kernel per layer, and an accepted tree path (not a
prefix of the tree's rows) has no way in. Here the length is a host integer, crop moves it, and `commit` moves a path's
rows into consecutive slots with one index_select and one index_copy_ per block, whatever the number of layers. The
layers are still StaticLayers (full-length keys and values returned to attention, the mask sizes transformers asks
for), only writing where they are told.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from specbench.errors import SpecbenchError


class SlotLayer(StaticLayer):
    """One layer's views into its cache's blocks; writes a forward's rows at the cache's `slots`."""

    def __init__(self, cache: SlotCache) -> None:
        super().__init__(max_cache_len=cache.capacity)
        self.cache = cache

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.cache.allocate(key_states, value_states)  # every layer's views at once

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys.index_copy_(2, self.cache.slots, key_states)
        self.values.index_copy_(2, self.cache.slots, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.cache.length

    def crop(self, max_length: int) -> None:
        self.cache.crop(max_length)


class SlotCache(Cache):
    """A transformers Cache of `capacity` slots per layer: `length` committed rows first, stale slots after them.

    `slots` ((n,) long, on the model's device) says where the next forward's n rows go; whoever runs the forward sets
    it (execution/graphs.py) and then moves `length` past the rows it keeps."""

    def __init__(self, config, capacity: int) -> None:
        text = config.get_text_config(decoder=True)
        types = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
        other = sorted(set(types) - {"full_attention"})
        if other:  # a sliding window keeps a ring of slots, which a path commit by index cannot address
            raise SpecbenchError(f"model.backend=graphs keeps a full-attention cache; this model has {other} layers: "
                                 f"use model.backend=eager or compile")
        self.capacity, self.length = capacity, 0
        self.slots: torch.Tensor | None = None
        self.key_block: torch.Tensor | None = None  # (layers, batch, kv heads, capacity, head dim)
        self.value_block: torch.Tensor | None = None
        super().__init__(layers=[SlotLayer(self) for _ in types])

    def allocate(self, keys: torch.Tensor, values: torch.Tensor, capacity: int | None = None) -> None:
        """The blocks for every layer, shaped as the first layer's new keys and values (zeros: finite, see the module
        docstring); with `capacity`, larger blocks holding the committed rows of the old ones."""
        old = (self.key_block, self.value_block)
        self.capacity = capacity or self.capacity
        shape = (len(self.layers), keys.shape[0], keys.shape[1], self.capacity)
        self.key_block = torch.zeros(*shape, keys.shape[-1], dtype=keys.dtype, device=keys.device)
        self.value_block = torch.zeros(*shape, values.shape[-1], dtype=values.dtype, device=values.device)
        if old[0] is not None:
            for new, was in zip((self.key_block, self.value_block), old):
                new[..., : self.length, :] = was[..., : self.length, :]
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values = self.key_block[i], self.value_block[i]
            layer.max_cache_len, layer.device, layer.is_initialized = self.capacity, keys.device, True

    def grow(self, capacity: int) -> None:
        """At least `capacity` slots; reallocates (new addresses: a captured forward must be captured again)."""
        if capacity > self.capacity:
            if self.key_block is None:
                self.capacity = capacity
            else:
                self.allocate(self.key_block[0], self.value_block[0], capacity)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """DynamicCache's meaning: keep max_length rows, or drop -max_length when negative. Only the length moves."""
        keep = self.length + max_length if max_length < 0 else min(self.length, max_length)
        if keep < 0:
            raise SpecbenchError(f"cannot crop {-max_length} rows from a cache of {self.length}")
        self.length = keep

    def reset(self) -> None:
        self.length = 0

    @torch.inference_mode()  # the blocks are inference tensors when a forward under inference mode allocated them
    def commit(self, past_len: int, path: list[int]) -> None:
        """Keep the first past_len rows plus the rows past_len + path (a verify's accepted path, root first) in
        consecutive slots. A path that is a prefix of the rows stays where it is."""
        keep = past_len + len(path)
        if path != list(range(len(path))):
            device = self.key_block.device
            src = torch.tensor(path, device=device) + past_len
            dst = torch.arange(past_len, keep, device=device)
            for block in (self.key_block, self.value_block):
                block.index_copy_(3, dst, block.index_select(3, src))  # gathered first: overlap is safe
        self.length = keep
