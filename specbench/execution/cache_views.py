"""A cache whose keys and values live in one buffer a runtime reads in place (OpenVINO's and ONNX Runtime's
forwards): the cache's layers made BufferLayers over the buffer's leading slots, and the masks and rows such a forward
reads from a call as the methods make it."""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# a cache buffer's capacity is a multiple of this many tokens: the attention's input shapes change only when a cache
# outgrows it, which costs one copy of the cache and, on OpenVINO, the CPU plugin's preparation of those nodes for the
# new shape; a masked slot adds an exact zero to the softmax
CACHE_STEP = 256


class CacheBuffer:
    """One cache's keys and values in memory a runtime reads in place: (2 x layers, 1, kv heads, capacity, head dim),
    the cache's rows first, finite stale slots after them. A runtime's subclass adds its own handle on `memory`."""

    def __init__(self, shape: tuple[int, int, int], capacity: int) -> None:
        layers_kv, kv_heads, width = shape
        self.capacity = capacity
        self.memory = torch.zeros(layers_kv, 1, kv_heads, capacity, width)
        self.layers = self.memory.unbind(0)
        self.installed: list = []  # the BufferLayers view_layers last gave a cache, as that cache's own list

    def holds(self, cache) -> bool:
        """Whether `cache`'s layers are this buffer's (its rows lie where the runtime reads): the very list of
        BufferLayers view_layers gave it, one identity check a call."""
        return cache.layers is self.installed

    def take(self, cache, past: int) -> None:
        """`cache`'s `past` rows copied in, unless they already lie here: a cache filled elsewhere, or outgrowing its
        buffer, costs one copy."""
        if past and not self.holds(cache):
            for t, slot in zip(layer_tensors(cache), self.layers):
                slot[:, :, :past] = t


class CacheBuffers:
    """Each cache's buffer (`make(shape, capacity)`, a CacheBuffer), held while the cache lives; shared by the
    forwards that run one cache (OpenVINO's w4a8r prefill and its steps), so a cache never moves between them.

    A dead cache's buffers are kept for the next cache of that capacity (the last SPARE of them): a new buffer's
    memory is zeroed and faulted in page by page, paid in every answer's timed prefill and again where it outgrows it
    (experiments/onnxruntime_verify). Their stale slots are finite, as a masked slot must be."""

    SPARE = 2

    def __init__(self, shape: tuple[int, int, int], make=CacheBuffer) -> None:
        self.shape, self.make = shape, make
        self._of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._spare: dict[int, CacheBuffer] = {}  # capacity -> a buffer no live cache holds, oldest first

    def holding(self, cache, tokens: int) -> CacheBuffer:
        """`cache`'s buffer with room for `tokens`: another one (the next multiple of CACHE_STEP, a spare one of that
        capacity where there is one) when it has none or less; the caller has the cache's rows taken into it
        (CacheBuffer.take)."""
        buffer = self._of.get(cache)
        if buffer is None or buffer.capacity < tokens:
            capacity = -(-tokens // CACHE_STEP) * CACHE_STEP
            buffer = self._spare.pop(capacity, None) or self.make(self.shape, capacity)
            self._of[cache] = buffer
            weakref.finalize(cache, self._release, buffer)
        return buffer

    def _release(self, buffer: CacheBuffer) -> None:
        self._spare.pop(buffer.capacity, None)
        self._spare[buffer.capacity] = buffer
        while len(self._spare) > self.SPARE:
            del self._spare[next(iter(self._spare))]


class BufferLayer(DynamicLayer):
    """One layer of a cache whose rows lie in a CacheBuffer: its keys and values are the first `length` slots of the
    buffer's, viewed when read. A step moves `length`; making 60 views a step instead (a tensor each for every layer's
    keys and values) was the largest share of a one-row step's Python (experiments/onnxruntime_verify)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self._keys, self._values, self.length = keys, values, length  # (1, kv heads, capacity, head dim) slots
        self.device, self.is_initialized = keys.device, True

    @property
    def keys(self) -> torch.Tensor:
        return self._keys[:, :, :self.length]

    @property
    def values(self) -> torch.Tensor:
        return self._values[:, :, :self.length]

    def get_seq_length(self) -> int:
        return self.length

    def nbytes(self) -> int:
        """The keys' and values' bytes, as the views would count them."""
        return 2 * self.length * self._keys[:, :, 0].numel() * self._keys.element_size()

    def crop(self, tokens_to_remove: int) -> None:
        """DynamicLayer's meaning (a negative count of rows to drop); only the length moves."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of rows to drop, not {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)

    def reset(self) -> None:
        self.length = 0

    def update(self, *args, **kwargs):
        raise TypeError("a BufferLayer's rows are written by its runtime's forward in place, not appended by update")


def view_layers(cache: DynamicCache, buffer: CacheBuffer, length: int, layers: int) -> None:
    """`cache`'s layers made the first `length` slots of `buffer.memory` (2 x layers, 1, kv heads, capacity, head dim):
    BufferLayers given to it once (its earlier layers, rows already taken into the buffer, replaced), their length
    moved on every later call."""
    if cache.layers is not buffer.installed:
        cache.layers = buffer.installed = [BufferLayer(keys, values, length) for keys, values in
                                           zip(buffer.layers[0:2 * layers:2], buffer.layers[1:2 * layers:2])]
        return
    for layer in buffer.installed:
        layer.length = length


def layer_tensors(cache: DynamicCache):
    """Every layer's keys and values, in the buffer's order (keys then values, layer by layer)."""
    return (t for layer in cache.layers for t in (layer.keys, layer.values))


def kept_row_indices(logits_to_keep, n: int) -> tuple[int, ...]:
    """The rows whose logits a call returns, as transformers' `logits_to_keep`: the last k for an int k (0: all),
    or the given row indices. A tuple, built without torch ops for an int: they are the dearest Python between two
    runs of a one-row step (experiments/onnxruntime_verify)."""
    if isinstance(logits_to_keep, torch.Tensor):
        return tuple(logits_to_keep.reshape(-1).tolist())
    return tuple(range(n - logits_to_keep if logits_to_keep else 0, n))


def kept_rows(logits_to_keep, n: int) -> torch.Tensor:
    """kept_row_indices as a tensor, for a forward that indexes or feeds its rows as one."""
    return torch.tensor(kept_row_indices(logits_to_keep, n), dtype=torch.long)


def causal_chain(mask: torch.Tensor, position_ids: torch.Tensor, past: int) -> bool:
    """Whether a call is one sequence's next rows in order, each seeing the cache and the rows before it (a prefill,
    a chain), which can be cut into consecutive pieces or run by any causal forward."""
    batch, _, n, _ = mask.shape
    return (batch == 1 and torch.equal(position_ids, torch.arange(past, past + n)[None])
            and torch.equal(mask, full_mask(None, 1, n, past)))


def full_mask(mask: torch.Tensor | None, batch: int, n: int, past: int) -> torch.Tensor:
    """The 4D boolean mask a runtime's graph takes: a 4D mask as given, else causal over the new rows, with a 2D
    padding mask (batch, past + n) applied to the keys when given."""
    if mask is not None and mask.dim() == 4:
        return mask.to(torch.bool)
    causal = torch.ones(n, past + n, dtype=torch.bool).tril(past)[None, None].expand(batch, 1, n, past + n)
    return causal if mask is None else causal & mask.to(torch.bool)[:, None, None, :]
