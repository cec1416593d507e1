"""The runtime adapter: a causal LM's forward as the methods call it, run by a compiled IR.

A batch-1 call reads its cache where it already lies. Every cache the adapter runs owns a buffer (CacheBuffer) whose
memory OpenVINO's requests read as their `past` input and whose leading slots the cache's layers are, so no call
copies the cache in and none concatenates onto it: the new rows' keys and values are written behind the cached ones
and the layers grow by them. The buffer's capacity steps by CACHE_STEP tokens (the attention's shapes move only
then, and one copy of the rows moves the cache into a larger buffer); the slots past the cache are masked and finite.
verification's commit_path and crop work on these layers as on any. A call of a few rows on a cache buffer runs
a model with every shape static, compiled for its row count and the buffer's capacity (compile.StaticModels: on the
first call at that size, or ahead by `compile_ahead`); where there is none, a model compiled for its row count alone
(compile.STATIC_ROWS). A longer prompt on an empty cache runs the prefill IR (attention.prefill_attention) and other
calls (a large tree) the dynamic model; a batch of several sequences copies its cache in and appends to it.
"""

from __future__ import annotations


import torch
from torch import nn
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.execution.cache_views import (CACHE_STEP, CacheBuffer, CacheBuffers, causal_chain, full_mask,
                                             kept_rows, layer_tensors, view_layers)
from specbench.execution.graph_forward import GraphForward, GraphOutput
from specbench.execution.openvino.attention import RECENT_DEPTH, window_inputs
from specbench.execution.openvino.compile import SIZED_ROWS, StaticModels
from specbench.execution.openvino.export import INPUTS
from specbench.execution.openvino.settings import ROW_INVARIANT_FORMAT
from specbench.models.shape import head_dim
from specbench.execution.row_claims import ROUNDING

# w4a8r: every call runs at least this many rows, as the CPU plugin quantises a one-row call by another kernel than
# a call of several rows (experiments/openvino_row_invariant)
ROW_INVARIANT_MIN_ROWS = 2
# a batch of several sequences copies its cache in, padded with masked keys to a multiple of this many tokens, so the
# dynamic model sees a new context length (and prepares its nodes again) every BATCH_BUCKET tokens, not every call
BATCH_BUCKET = 32
PAST = INPUTS.index("past")


class OpenVinoBuffer(CacheBuffer):
    """A cache buffer with the OpenVINO tensor its requests read as their `past` input, sharing its memory."""

    def __init__(self, shape: tuple[int, int, int], capacity: int) -> None:
        import openvino as ov

        super().__init__(shape, capacity)
        self.tensor = ov.Tensor(self.memory.numpy(), shared_memory=True)


class OpenVinoForward(GraphForward):
    """A causal LM's forward as the methods call it (input ids or embeddings, a 4D or 2D mask or none, positions, a
    DynamicCache, logits_to_keep), run by a compiled OpenVINO IR (export.py). `claims` says what the route promises
    of a verify's rows (BITWISE, ROUNDING or DIFFERS). `static` (compile.StaticModels) runs a call of a compiled row
    count at its cache buffer's capacity where it can; without it those calls run the row models, context dynamic.
    `buffers` shares another forward's cache buffers (the prefill's do: one cache run by two IRs never moves)."""

    def __init__(self, model: nn.Module, compiled, by_rows: dict | None = None, claims: str = ROUNDING,
                 row_invariant: bool = False, prefill: "OpenVinoForward | None" = None,
                 static: "StaticModels | None" = None, buffers: CacheBuffers | None = None) -> None:
        super().__init__(model)
        import openvino as ov

        self.claims = claims
        self.row_invariant = row_invariant  # the IR traces recent_attention; every call runs >= 2 rows (w4a8r)
        self.prefill = prefill  # a prompt no compiled row count holds runs in one call of this (route.py says why)
        shape = (2 * self.layers, model.config.num_key_value_heads, head_dim(model.config))
        if buffers is None:
            buffers = prefill.buffers if prefill is not None else CacheBuffers(shape, OpenVinoBuffer)
        self.buffers = buffers
        self.request = compiled.create_infer_request()  # batch 1: reads a cache buffer in place
        self.batch_request = compiled.create_infer_request()  # batches: the cache copied into its own memory
        self.by_rows = {rows: c.create_infer_request() for rows, c in (by_rows or {}).items()}
        self.static = static
        self._empty = ov.Tensor(torch.zeros(shape[0], 1, shape[1], 0, shape[2]).numpy())  # an empty cache's input
        self._views: dict[tuple[int, int], tuple[tuple[int, ...], torch.Tensor]] = {}  # (request, port) -> its view
        self._bound: dict[int, object] = {}  # request -> the past tensor it reads

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=True, output_hidden_states=False, logits_to_keep=0, **_):
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        embeds = embeds.to(torch.float32).detach()
        batch, n = embeds.shape[:2]
        cache = past_key_values if past_key_values is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n)[None].expand(batch, n)
        mask = full_mask(attention_mask, batch, n, past)
        if (self.prefill is not None and past == 0 and self._rows(n) is None
                and causal_chain(mask, position_ids, past)):
            return self.prefill(inputs_embeds=embeds, position_ids=position_ids, past_key_values=cache,
                                output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep)
        if self.row_invariant and (batch != 1 or int(position_ids.max()) - past > RECENT_DEPTH):
            return self._in_pieces(embeds, mask, position_ids, cache, output_hidden_states)
        if batch != 1:
            return self._batched(embeds, mask, position_ids, cache, output_hidden_states, logits_to_keep)
        buffer = self.buffers.holding(cache, past + n)
        buffer.take(cache, past)
        # recent_attention gathers from a cache of at least one slot; an empty cache is read as none
        width = buffer.capacity if past or self.row_invariant else 0
        rows, request = self._sized(n, width)
        call_rows = rows or (max(n, ROW_INVARIANT_MIN_ROWS) if self.row_invariant else n)
        if call_rows > n:
            embeds, mask, position_ids = _padded_rows(embeds, mask, position_ids, call_rows)
        if self.row_invariant:
            cached, *window = window_inputs(mask, position_ids, past, width)
            values = {1: cached, **dict(enumerate(window, start=len(INPUTS)))}
        else:
            values = {1: padded_mask(mask, past, width)}
        hidden_rows = torch.arange(call_rows if rows else n) if output_hidden_states else torch.arange(0)
        values |= {0: embeds, 2: position_ids, 4: torch.arange(call_rows) if rows else kept_rows(logits_to_keep, n),
                   5: hidden_rows}
        self._bind(request, buffer.tensor if width else self._empty)
        for port, value in values.items():
            self._view(request, port, tuple(value.shape)).copy_(value)
        request.infer()
        logits, hidden, new = (torch.from_numpy(request.get_output_tensor(i).data) for i in range(3))
        buffer.memory[:, :, :, past:past + n] = new[:, :, :, :n]
        view_layers(cache, buffer, past + n, self.layers)
        # copies of the outputs: the request reuses its buffers on the next call
        logits = _kept(logits, logits_to_keep, n) if rows else logits.clone()
        hidden = hidden[:, :, :n].clone().unbind(0) if output_hidden_states else None
        return GraphOutput(logits=logits, hidden_states=hidden)

    def _batched(self, embeds, mask, position_ids, cache: DynamicCache, output_hidden_states: bool, logits_to_keep):
        """A batch of sequences on the dynamic model: the cache copied into the request's own input memory (padded to
        a multiple of BATCH_BUCKET with masked keys), the new rows appended to the cache's layers."""
        batch, n = embeds.shape[:2]
        past, request = cache.get_seq_length(), self.batch_request
        padded = -(-past // BATCH_BUCKET) * BATCH_BUCKET
        if self.row_invariant:  # recent_attention gathers from a cache of at least one slot
            padded = max(padded, BATCH_BUCKET)
            embeds, mask, position_ids = _padded_rows(embeds, mask, position_ids, max(n, ROW_INVARIANT_MIN_ROWS))
        layers_kv, kv_heads, width = self.buffers.shape
        past_port = self._view(request, PAST, (layers_kv, batch, kv_heads, padded, width))
        past_port[:, :, :, past:].zero_()  # masked out, but finite: a masked key's weight is 0, and 0 * nan is nan
        for t, port in zip(layer_tensors(cache), past_port.unbind(0)):
            port[:, :, :past] = t
        values = {0: embeds, 1: padded_mask(mask, past, padded), 2: position_ids,
                  4: kept_rows(logits_to_keep, n), 5: torch.arange(n) if output_hidden_states else torch.arange(0)}
        for port, value in values.items():
            self._view(request, port, tuple(value.shape)).copy_(value)
        request.infer()
        logits, hidden, new = (torch.from_numpy(request.get_output_tensor(i).data) for i in range(3))
        for layer in range(self.layers):  # copies: the request's output buffers are reused by the next call
            cache.update(new[2 * layer, :, :, :n].clone(), new[2 * layer + 1, :, :, :n].clone(), layer)
        hidden = hidden[:, :, :n].clone().unbind(0) if output_hidden_states else None
        return GraphOutput(logits=logits.clone(), hidden_states=hidden)

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
        return GraphOutput(logits=torch.cat([o.logits for o in outs], 1), hidden_states=hidden)

    def compile_ahead(self, shortest: int, longest: int) -> None:
        """Compile now the static models of every row count up to the most this forward has run at, for every
        buffer capacity a cache of `shortest` to `longest` tokens takes: a run that calls this after its untimed
        warm-up (which met its largest draft) times no compile, smaller drafts of a later step included."""
        if self.static is None:
            return
        most = max(self.static.rows_seen(), default=0)
        for rows in (r for r in SIZED_ROWS if r <= most):
            for capacity in range(-(-(shortest + 1) // CACHE_STEP) * CACHE_STEP, longest + CACHE_STEP, CACHE_STEP):
                self.static.request(rows, capacity)

    def _sized(self, n: int, width: int) -> tuple[int | None, object]:
        """(rows, request) for a batch-1 call of n rows on a cache buffer of `width` slots: the fewest rows holding n
        that a static model of that capacity (StaticModels, any of SIZED_ROWS) or a row model runs, the call padded
        up to them; else the dynamic model at n rows (rows None)."""
        for rows in sorted(r for r in {*SIZED_ROWS, *self.by_rows} if r >= n):
            request = self.static.request(rows, width) if self.static is not None else None
            if request is None:
                request = self.by_rows.get(rows)
            if request is not None:
                return rows, request
        return None, self.request

    def padded_rows(self, n: int) -> int:
        """The rows a batch-1 call of n rows computes: a static or row model pads it up to its own count (a cost
        curve measured at some row counts reads the padded one), the dynamic model runs n."""
        counts = {*SIZED_ROWS, *self.by_rows} if self.static is not None else set(self.by_rows)
        return min((rows for rows in counts if rows >= n), default=n)

    def _rows(self, n: int) -> int | None:
        """The row count of the compiled model this batch-1 call of n rows runs at (the smallest holding it)."""
        fits = [rows for rows in self.by_rows if rows >= n]
        return min(fits) if fits else None

    def _bind(self, request, tensor) -> None:
        """`request` reads its cache from `tensor` (shared memory, never copied)."""
        if self._bound.get(id(request)) is not tensor:
            request.set_input_tensor(PAST, tensor)
            self._bound[id(request)] = tensor

    def _view(self, request, port: int, shape: tuple[int, ...]) -> torch.Tensor:
        """`request`'s own input tensor at `port`, shaped `shape`, as a torch view of its memory (kept while the
        shape stays: made per call, the views cost a visible share of a one-row step)."""
        key = (id(request), port)
        known = self._views.get(key)
        if known is None or known[0] != shape:
            tensor = request.get_input_tensor(port)
            if tuple(tensor.shape) != shape:
                tensor.shape = shape
            known = self._views[key] = (shape, torch.from_numpy(tensor.data))
        return known[1]


def _padded_rows(embeds, mask, position_ids, rows: int):
    """The call padded to `rows` rows: zero embeddings, each seeing only itself, their outputs dropped."""
    batch, n = embeds.shape[:2]
    past = mask.shape[3] - n
    embeds = torch.cat([embeds, embeds.new_zeros(batch, rows - n, embeds.shape[2])], 1)
    position_ids = torch.cat([position_ids, position_ids[:, -1:].expand(batch, rows - n)], 1)
    mask = torch.cat([torch.cat([mask, mask.new_zeros(batch, 1, n, rows - n)], 3),
                      torch.cat([mask.new_zeros(batch, 1, rows - n, past),
                                 torch.eye(rows, dtype=torch.bool)[n:].expand(batch, 1, rows - n, rows)], 3)], 2)
    return embeds, mask, position_ids


def _kept(logits: torch.Tensor, logits_to_keep, n: int) -> torch.Tensor:
    """A copy of the kept rows of a padded call's logits (kept_rows): the last k by one slice, given rows by one
    gather, so the rows are copied once."""
    if isinstance(logits_to_keep, torch.Tensor):
        return logits.index_select(1, kept_rows(logits_to_keep, n))
    return logits[:, n - logits_to_keep if logits_to_keep else 0:n].clone()


def padded_mask(mask: torch.Tensor, past: int, padded: int) -> torch.Tensor:
    """`mask` (batch, 1, n, past + n) with padded - past masked-out keys between the cached ones and the new rows:
    the columns of a cache of `padded` slots, its first `past` the cache's rows."""
    if padded == past:
        return mask
    batch, _, n, _ = mask.shape
    out = torch.zeros(batch, 1, n, padded + n, dtype=torch.bool)
    out[..., :past] = mask[..., :past]
    out[..., padded:] = mask[..., past:]
    return out
