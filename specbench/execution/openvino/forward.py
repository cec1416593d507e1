"""The runtime adapter: a causal LM's forward as the methods call it, run by a compiled IR, the run's own
DynamicCache fed in and the new rows' keys and values appended to it, batch-1 calls of a few rows at a padded static
shape whose request memory then holds the cache."""

from __future__ import annotations

import weakref

import torch
from torch import nn
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from specbench.errors import SpecbenchError
from specbench.execution.openvino.attention import RECENT_DEPTH, window_inputs
from specbench.execution.openvino.settings import ROW_INVARIANT_FORMAT
from specbench.models.shape import head_dim

# w4a8r: every call runs at least this many rows, as the CPU plugin quantises a one-row call by another kernel than
# a call of several rows (experiments/openvino_row_invariant)
ROW_INVARIANT_MIN_ROWS = 2
# the cache goes in padded with masked-out keys to a multiple of this many tokens: OpenVINO's CPU plugin prepares every
# node again for an input shape it has not just run, where a padded context runs as fast as the same length
# (experiments/openvino_same_model); a masked key adds an exact zero to the softmax
BUCKET = 32


class OpenVinoForward(nn.Module):
    """A causal LM's forward as the methods call it (input ids or embeddings, a 4D or 2D mask or none, positions, a
    DynamicCache), run by a compiled OpenVINO IR (export.py). The embedding stays a PyTorch module, so
    `get_input_embeddings`, `parameters()` and the memory accounting see it."""

    def __init__(self, model: nn.Module, compiled, static: dict | None = None, row_invariant: bool = False,
                 prefill: "OpenVinoForward | None" = None) -> None:
        super().__init__()
        self.row_invariant = row_invariant  # the IR traces recent_attention; every call runs >= 2 rows (w4a8r)
        self.prefill = prefill  # w4a8r: a prompt on an empty cache runs in one call of this (route.py says why)
        self.embed = model.get_input_embeddings()
        self.config, self.generation_config = model.config, model.generation_config
        self.request = compiled.create_infer_request()
        self.static = {shape: c.create_infer_request() for shape, c in (static or {}).items()}  # (rows, context)
        self._owners: dict[tuple[int, int], weakref.ref] = {}  # static shape -> the cache whose rows its memory holds
        self.layers = model.config.num_hidden_layers
        self.empty_cache = (2 * self.layers, model.config.num_key_value_heads, 0, head_dim(model.config))
        # a static request's input tensors keep their shape and memory, so their torch views are made once, and its
        # cache input's per-layer views too (per call, they cost a visible share of a one-row step)
        self._ports = {shape: tuple(torch.from_numpy(t.data) for t in request.input_tensors)
                       for shape, request in self.static.items()}
        self._layer_ports = {shape: ports[3].unbind(0) for shape, ports in self._ports.items()}
        for ports in self._ports.values():  # masked keys must be finite (0 * nan is nan); later calls leave theirs
            for port in ports:
                port.zero_()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=True, output_hidden_states=False, **_):
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        embeds = embeds.to(torch.float32).detach()
        batch, n = embeds.shape[:2]
        cache = past_key_values if past_key_values is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n)[None].expand(batch, n)
        mask = full_mask(attention_mask, batch, n, past)
        if self.row_invariant and (batch != 1 or int(position_ids.max()) - past > RECENT_DEPTH):
            if self.prefill is not None and past == 0 and causal_chain(mask, position_ids, past):
                return self.prefill(inputs_embeds=embeds, position_ids=position_ids, past_key_values=cache,
                                    output_hidden_states=output_hidden_states)
            return self._in_pieces(embeds, mask, position_ids, cache, output_hidden_states)
        shape = self._static_shape(batch, n, past)
        if shape:
            request, (rows, padded) = self.static[shape], shape
        elif self.row_invariant:  # recent_attention gathers from a cache of at least one slot
            request, rows, padded = self.request, max(n, ROW_INVARIANT_MIN_ROWS), max(-(-past // BUCKET), 1) * BUCKET
        else:
            request, rows, padded = self.request, n, -(-past // BUCKET) * BUCKET
        if rows > n:  # padding rows: zero embeddings, each seeing only itself, outputs dropped
            embeds = torch.cat([embeds, embeds.new_zeros(batch, rows - n, embeds.shape[2])], 1)
            position_ids = torch.cat([position_ids, position_ids[:, -1:].expand(batch, rows - n)], 1)
            mask = torch.cat([torch.cat([mask, mask.new_zeros(batch, 1, n, rows - n)], 3),
                              torch.cat([mask.new_zeros(batch, 1, rows - n, past),
                                         torch.eye(rows, dtype=torch.bool)[n:].expand(batch, 1, rows - n, rows)], 3)],
                             2)
        if self.row_invariant:  # input port -> value
            cached, *window = window_inputs(mask, position_ids, past, padded)
            values = {0: embeds, 1: cached, 2: position_ids, **dict(enumerate(window, start=4))}
        else:
            values = {0: embeds, 1: padded_mask(mask, past, padded), 2: position_ids}
        layers_kv, kv_heads, _, width = self.empty_cache
        # every input is written straight into the request's own tensors, the cache from its layers in one copy: shared
        # instead (share_inputs=True, or tensors made with shared_memory) the cache's arrays made OpenVINO's CPU
        # plugin corrupt the heap on the call after a tree verify (glibc: corrupted double-linked list), as if it
        # wrote past them
        if shape:
            ports, layer_ports = self._ports[shape], self._layer_ports[shape]
            self._own(shape, cache)
        else:
            ports = {port: request_input(request, port, tuple(value.shape)) for port, value in values.items()}
            ports[3] = request_input(request, 3, (layers_kv, batch, kv_heads, padded, width))
            layer_ports = ports[3].unbind(0)
            ports[3][:, :, :, past:].zero_()  # masked out, but finite: a masked key's weight is 0, and 0 * nan is nan
        if past:
            for t, port in zip((t for layer in cache.layers for t in (layer.keys, layer.values)), layer_ports):
                if not views(t, port):  # a layer already in this request's memory is not copied again
                    port[:, :, :past] = t
        for port, value in values.items():
            ports[port].copy_(value)
        request.infer()
        logits, hidden, new = (torch.from_numpy(request.get_output_tensor(i).data) for i in range(3))
        if shape and past and past + n <= padded:
            # the new rows go into the request's own cache tensor behind the cached ones and every layer becomes a
            # view of it, so the next call of this shape copies nothing in and DynamicCache.update concatenates
            # nothing; crop and commit_path work on views as on any tensor, and _own detaches a cache's views before
            # another cache writes this memory
            ports[3][:, :, :, past:past + n] = new[:, :, :, :n]
            layer_views = ports[3].narrow(3, 0, past + n).unbind(0)
            for layer, keys, values in zip(cache.layers, layer_views[0::2], layer_views[1::2]):
                layer.keys, layer.values = keys, values
        else:
            for layer in range(self.layers):  # copies: the request's output buffers are reused by the next call
                cache.update(new[2 * layer, :, :, :n].clone(), new[2 * layer + 1, :, :, :n].clone(), layer)
        # one copy of every layer's rows, then views: the request's output buffers are reused by the next call
        hidden = hidden[:, :, :n].clone().unbind(0) if output_hidden_states else None
        return CausalLMOutputWithPast(logits=logits[:, :n].clone(), past_key_values=cache, hidden_states=hidden)

    def _in_pieces(self, embeds, mask, position_ids, cache: DynamicCache, output_hidden_states: bool):
        """A row-invariant call too deep for recent_attention's window (a long chain after the prompt) as consecutive
        pieces of RECENT_DEPTH rows, each seeing the pieces before it as cached; only a causal chain of batch 1 can be
        cut so."""
        batch, n = embeds.shape[:2]
        past = cache.get_seq_length()
        if not causal_chain(mask, position_ids, past):
            raise SpecbenchError(f"model.weights={ROW_INVARIANT_FORMAT}: a call of batch {batch} with rows up to "
                                 f"{int(position_ids.max()) - past} positions past its cache cannot run row-invariant; "
                                 f"it runs batch 1 with trees at most {RECENT_DEPTH} deep (a longer causal chain is "
                                 f"run in pieces)")
        outs = [self.forward(inputs_embeds=embeds[:, i:i + RECENT_DEPTH], past_key_values=cache,
                             output_hidden_states=output_hidden_states) for i in range(0, n, RECENT_DEPTH)]
        hidden = tuple(torch.cat(layer, 1) for layer in zip(*(o.hidden_states for o in outs))) \
            if output_hidden_states else None
        return CausalLMOutputWithPast(logits=torch.cat([o.logits for o in outs], 1), past_key_values=cache,
                                      hidden_states=hidden)

    def _own(self, shape: tuple[int, int], cache: DynamicCache) -> None:
        """`cache` is about to write the static request `shape`'s cache memory: another cache whose layers are views of
        it (a generation before, still referenced) gets copies of them first, so it never sees this cache's rows."""
        owner = self._owners.get(shape)
        other = owner() if owner is not None else None
        if other is not None and other is not cache:
            for layer, port in zip(other.layers, self._layer_ports[shape][0::2]):
                if getattr(layer, "keys", None) is not None and views(layer.keys, port):
                    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        self._owners[shape] = weakref.ref(cache)

    def _static_shape(self, batch: int, n: int, past: int) -> tuple[int, int] | None:
        """The (rows, context) a compiled static model serves this call at (the smallest that holds it), or None."""
        if batch != 1:
            return None
        fits = [shape for shape in self.static if n <= shape[0] and past <= shape[1]]
        return min(fits) if fits else None


def causal_chain(mask: torch.Tensor, position_ids: torch.Tensor, past: int) -> bool:
    """Whether a call is one sequence's next rows in order, each seeing the cache and the rows before it (a prefill,
    a chain), which can be cut into consecutive pieces or run by any causal forward."""
    batch, _, n, _ = mask.shape
    return (batch == 1 and torch.equal(position_ids, torch.arange(past, past + n)[None])
            and torch.equal(mask, full_mask(None, 1, n, past)))


def views(t: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether `t` is a leading slice of `base`'s memory: the same first element and strides."""
    return t.data_ptr() == base.data_ptr() and t.stride() == base.stride()


def request_input(request, port: int, shape: tuple[int, ...]) -> torch.Tensor:
    """`request`'s own input tensor at `port`, shaped `shape`, as a torch view of its memory."""
    tensor = request.get_input_tensor(port)
    if tuple(tensor.shape) != shape:
        tensor.shape = shape
    return torch.from_numpy(tensor.data)


def padded_mask(mask: torch.Tensor, past: int, padded: int) -> torch.Tensor:
    """`mask` (batch, 1, n, past + n) with padded - past masked-out keys between the cached ones and the new rows,
    the columns of the cache `forward` gives the IR, padded to a multiple of BUCKET."""
    if padded == past:
        return mask
    batch, _, n, _ = mask.shape
    out = torch.zeros(batch, 1, n, padded + n, dtype=torch.bool)
    out[..., :past] = mask[..., :past]
    out[..., padded:] = mask[..., past:]
    return out


def full_mask(mask: torch.Tensor | None, batch: int, n: int, past: int) -> torch.Tensor:
    """The 4D boolean mask the IR takes: a 4D mask as given, else causal over the new rows, with a 2D padding mask
    (batch, past + n) applied to the keys when given."""
    if mask is not None and mask.dim() == 4:
        return mask.to(torch.bool)
    causal = torch.ones(n, past + n, dtype=torch.bool).tril(past)[None, None].expand(batch, 1, n, past + n)
    return causal if mask is None else causal & mask.to(torch.bool)[:, None, None, :]
