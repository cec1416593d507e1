"""The runtime adapter: a causal LM's forward as the methods call it, run by ONNX Runtime on the builder's verify graph
(export.py), batch 1.

Every cache the adapter runs owns a buffer whose memory is each GroupQueryAttention node's past and present at once
(ONNX Runtime's shared-buffer mode, as ONNX Runtime GenAI runs it): a call writes its rows' keys and values behind the
cached ones in place and the cache's layers (BufferLayers) grow by them, so nothing is copied per call. The capacity
steps by CACHE_STEP tokens, one copy of the rows moving the cache into a larger buffer. verification's commit_path and
crop work on these layers as on any.

Why every attention runs at least two rows: GroupQueryAttention over a cache sums a lone row in another order than the
rows of a call of two or more (float rounding: MLAS's SGEMM runs a one-row product by its own kernel and packs the cache
first for more rows), which int8 activations grow to tenths of a logit, where a row of a call of two or more rows is
bitwise the same whatever the other rows (experiments/onnxruntime_verify). So a one-row call pads its attention with a
second row, which a verify's rows then match bit for bit along a chain. Whether the rest of the graph (its int8
products, the LM head) gives a lone row the bits it gives that row among others depends on the machine's kernels, so the
forward measures it once it loads: where it does, a one-row call runs its other layers on its one row; where it does
not, it pads the whole call.

A prompt on an empty cache may run the prefill graph instead (export.float_prefill: the same graph on float
activations), from as many rows as this machine runs it faster at (measured once, kept beside the graphs). Both graphs
share the cache buffer; a prompt's plain decoding and its methods prefill it alike, so what they compare stays the
verify's rows.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.execution.cache_views import CacheBuffer, CacheBuffers, full_mask, kept_row_indices, view_layers
from specbench.execution.graph_forward import GraphForward, GraphOutput
from specbench.files import write_atomic
from specbench.models.shape import head_dim

MIN_ROWS = 2
PROBE_CONTEXTS = (30, 250)  # the machine's row check's CONTEXTS (hardware/measured/row_invariance.py, a layer above
# this one, which may not be imported here)
PREFILL_PROBE_ROWS = (16, 32, 64, 128, 256)  # the prompt lengths _measured_prefill_rows times both graphs at
PREFILL_PROBE_TRIES = 3  # each graph's fastest of these many calls, interleaved
NEGATIVE = float(torch.finfo(torch.float32).min)  # a masked key's bias: its weight is an exact 0


class SessionBinding:
    """One session's IO binding on a cache buffer: every layer's past and present bound to the buffer's memory, which
    ONNX Runtime reads and writes in place, and a call's other inputs bound by address."""

    def __init__(self, session, values: list) -> None:
        self.session, self.binding = session, session.io_binding()
        for i, value in enumerate(values):
            name = f"{i // 2}.{'key' if i % 2 == 0 else 'value'}"
            self.binding.bind_ortvalue_input(f"past_key_values.{name}", value)
            self.binding.bind_ortvalue_output(f"present.{name}", value)
        self._bound: dict[str, np.ndarray] = {}

    def bind(self, inputs: dict[str, np.ndarray]) -> None:
        """Each input bound by address, unless the very array is bound already (the row indices _indices shares
        between calls of one shape): a bind is a visible share of a one-row step's Python. The binding holds every
        array it is given until it is rebound."""
        for name, array in inputs.items():
            if self._bound.get(name) is not array:
                self.binding.bind_cpu_input(name, np.ascontiguousarray(array))
                self._bound[name] = array

    def run(self, logits: torch.Tensor) -> None:
        """The call, its logits written into `logits`."""
        self.binding.bind_output("logits", "cpu", 0, np.float32, tuple(logits.shape), logits.data_ptr())
        self.session.run_with_iobinding(self.binding)


class OnnxRuntimeBuffer(CacheBuffer):
    """A cache buffer each of the forward's sessions reads and writes in place, through its own binding."""

    def __init__(self, sessions: tuple, shape: tuple[int, int, int], capacity: int) -> None:
        import onnxruntime as ort

        super().__init__(shape, capacity)
        self._values = [ort.OrtValue.ortvalue_from_numpy(t.numpy()) for t in self.layers]
        self.bindings = [SessionBinding(session, self._values) for session in sessions]


class OnnxRuntimeForward(GraphForward):
    """A causal LM's forward as the methods call it (input ids, a 4D or 2D mask or none, positions, a DynamicCache,
    logits_to_keep), run by an ONNX Runtime session of the verify graph, which embeds the ids itself and returns
    logits only, no hidden states."""

    def __init__(self, model: nn.Module, path: str, threads: int, chains_only: bool,
                 prefill_path: str | None = None) -> None:
        super().__init__(model)
        # int8 activations turn a tree row's float rounding (its attention sums its keys in other lanes when a sibling
        # sits between them) into tenths of a logit; a chain's rows are bitwise its plain decoding's
        # (experiments/onnxruntime_verify), so the Decoder verifies a draft's first path only
        self.chains_only = chains_only
        # ONNX Runtime's pool spins between calls (its default, as its own engine runs): a torch op of two threads
        # between two calls waits for the core a spinner holds, and turning the spinning off lengthens every call. So
        # the Decoder runs torch's small ops on one thread around this forward (experiments/onnxruntime_verify)
        self.torch_threads = 1
        sessions = [_session(path, threads)]
        if prefill_path is not None:
            # its pool stops spinning when a prompt's call returns: left spinning, it held a core through the steps
            # after it, which ran slower (experiments/onnxruntime_verify)
            sessions.append(_session(prefill_path, threads, {"session.force_spinning_stop": "1"}))
        self.session = sessions[0]
        self.vocab = model.config.vocab_size
        self.positions = model.config.max_position_embeddings
        self.shape = (2 * self.layers, model.config.num_key_value_heads, head_dim(model.config))
        self.buffers = CacheBuffers(self.shape, functools.partial(OnnxRuntimeBuffer, tuple(sessions)))
        # a prompt of at least this many rows on an empty cache runs the prefill graph (export.float_prefill); None:
        # every call runs the verify graph
        self.prefill_rows: int | None = None
        self.attention_pad = True  # the mode the probes run, then the lone-row probe's verdict
        if prefill_path is not None:
            self.prefill_rows = self._measured_prefill_rows(Path(prefill_path).with_suffix(".json"), threads)
        self.attention_pad = self._lone_row_kept()

    def padded_rows(self, n: int) -> int:
        """The rows a call of n rows runs through its linear layers (n, or at least MIN_ROWS where this machine's
        kernels give a lone row other bits): the cost curve reads L at these."""
        return n if self.attention_pad else max(n, MIN_ROWS)

    @torch.inference_mode()
    def _measured_prefill_rows(self, record: Path, threads: int) -> int | None:
        """The fewest prompt rows from which the prefill graph runs a prompt faster than the verify graph on this
        machine: the shortest probed prompt from which it is faster at every longer one (None where it never is).
        Measured once per machine and thread count and kept beside the graphs (the cache is the machine's own), so
        every run here runs a prompt by the same graph: a prompt's plain decoding and its methods must share it."""
        key = f"threads={threads}"
        try:
            kept = json.loads(record.read_text())
        except (OSError, ValueError):
            kept = {}
        kept = kept if isinstance(kept, dict) else {}
        entry = kept.get(key)
        if isinstance(entry, dict) and "rows" in entry:
            if entry["rows"] is None or (type(entry["rows"]) is int and entry["rows"] >= 1):
                return entry["rows"]
            print(f"notice: {record} holds rows={entry['rows']!r} for {key}, not a row count >= 1 or null; "
                  f"measuring again")
        generator, ms = torch.Generator().manual_seed(0), {}
        for n in (p for p in PREFILL_PROBE_ROWS if p <= self.positions):
            ids = torch.randint(self.vocab, (1, n), generator=generator)
            runs = {graph: [] for graph in (None, 1)}  # the verify graph, the prefill graph
            for _ in range(PREFILL_PROBE_TRIES):
                for graph in runs:
                    self.prefill_rows = graph
                    start = time.perf_counter()
                    self(input_ids=ids, past_key_values=DynamicCache(config=self.config), logits_to_keep=1)
                    runs[graph].append((time.perf_counter() - start) * 1e3)
            ms[n] = [round(min(runs[None]), 2), round(min(runs[1]), 2)]
        faster = [n for n, (verify, prefill) in ms.items() if prefill < verify]
        rows = next((n for n in faster if all(m in faster for m in ms if m >= n)), None)
        kept[key] = {"rows": rows, "ms_verify_vs_prefill": ms}
        try:
            write_atomic(record, json.dumps(kept, indent=1))
        except OSError as exc:  # a cache this process cannot write: the next run measures again
            print(f"notice: cannot keep the prefill graph's measured rows in {record} ({exc.strerror or exc})")
        return rows

    @torch.inference_mode()
    def _lone_row_kept(self) -> bool:
        """Whether a one-row call, its attention alone padded, gives the logits the same row gets first in a call of
        two, at a short and a longer context (random tokens); the machine's row check then checks the route as run."""
        generator = torch.Generator().manual_seed(0)
        for context in PROBE_CONTEXTS:
            if context + 2 > self.positions:
                continue
            ids = torch.randint(self.vocab, (1, context + 2), generator=generator)
            cache = DynamicCache(config=self.config)
            self(input_ids=ids[:, :context], past_key_values=cache, logits_to_keep=1)
            alone = self(input_ids=ids[:, context:context + 1], past_key_values=cache).logits[0, 0]
            cache.crop(-1)
            pair = self(input_ids=ids[:, context:], past_key_values=cache).logits[0, 0]
            if not torch.equal(alone, pair):
                return False
        return True

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=True, output_hidden_states=False, logits_to_keep=0, **_):
        if input_ids is None or output_hidden_states:
            raise SpecbenchError("model.backend=onnxruntime runs the builder's graph, which takes token ids and "
                                 "returns logits only: a method that feeds embeddings or reads hidden states (EAGLE, "
                                 "Medusa, PPD, the EAGLE hybrid) runs on another backend")
        batch, n = input_ids.shape
        if batch != 1:
            raise SpecbenchError(f"model.backend=onnxruntime decodes one sequence at a time; eval.batch_size={batch} "
                                 f"runs on another backend")
        cache = past_key_values if past_key_values is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        rows, hidden = max(n, MIN_ROWS), self.padded_rows(n)  # the attention's rows, the other layers' rows
        if past + rows > self.positions:
            raise SpecbenchError(f"model.backend=onnxruntime: a call reaching {past + rows} tokens is past the model's "
                                 f"{self.positions} positions, where the builder's rotary tables end; keep prompts, "
                                 f"answers and eval.profile_contexts within them")
        # the inputs are built in numpy, which ONNX Runtime binds without a copy: torch's small ops and conversions
        # were a visible share of a one-row step's Python
        ids = input_ids.numpy().astype(np.int64)
        if hidden > n:  # a pad row through every layer
            ids = np.concatenate([ids, np.repeat(ids[:, -1:], hidden - n, 1)], 1)
        if position_ids is None:
            positions = np.arange(past, past + rows)
        else:  # a pad row: the last row again one position on, seeing every row; its outputs are dropped
            given = position_ids.numpy()[0]
            positions = np.concatenate([given, given[-1] + np.arange(1, rows - n + 1)])
        buffer = self.buffers.holding(cache, past + rows)
        buffer.take(cache, past)
        # a chain's mask (none given) is GroupQueryAttention's own causal one; a tree's keeps each row from the rows
        # that are not its ancestors
        bias = np.zeros((1, 1, rows, past + rows), np.float32)
        if attention_mask is not None:
            bias[0, 0, :n, :past + n][~full_mask(attention_mask, 1, n, past)[0, 0].numpy()] = NEGATIVE
            bias[0, 0, :n, past + n:] = NEGATIVE
        keep = kept_row_indices(logits_to_keep, n)
        projected = keep if self.attention_pad else _projected(keep, rows)
        logits = torch.empty(1, len(projected), self.vocab)
        prefill = self.prefill_rows is not None and past == 0 and n >= self.prefill_rows
        call = buffer.bindings[1 if prefill else 0]
        call.bind({"input_ids": ids, "position_ids": positions.astype(np.int64)[None], "attention_bias": bias,
                   "attention_mask": np.ones((1, past + rows), np.int64), **_indices(rows, hidden),
                   "logits_rows": _logits_rows(projected)})
        call.run(logits)
        view_layers(cache, buffer, past + n, self.layers)
        return GraphOutput(logits=logits[:, :len(keep)])


def _session(path: str, threads: int, config: dict[str, str] | None = None):
    """An ONNX Runtime session of the graph at `path` on `threads` threads, on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=64)
def _indices(rows: int, hidden: int) -> dict[str, np.ndarray]:
    """The attention's rows (a pad row repeats the last real one) and those it hands on: the same arrays for every
    call of one shape, so a step binds them once (SessionBinding.bind); read-only, being shared."""
    return {"attention_rows": _frozen(np.minimum(np.arange(rows), hidden - 1)),
            "attention_kept": _frozen(np.arange(hidden))}


@functools.lru_cache(maxsize=256)
def _logits_rows(rows: tuple[int, ...]) -> np.ndarray:
    """The rows the LM head projects, one array per set of rows (SessionBinding.bind binds it once); read-only."""
    return _frozen(np.array(rows, np.int64))


def _frozen(array: np.ndarray) -> np.ndarray:
    """`array` made read-only: the cached index arrays are bound by address and shared by every call of a shape."""
    array.flags.writeable = False
    return array


def _projected(keep: tuple[int, ...], rows: int) -> tuple[int, ...]:
    """The rows the LM head projects: the kept ones first, then others of the call up to MIN_ROWS, so the head too
    multiplies at least two rows (a prompt's last row alone would take the one-row kernel)."""
    if len(keep) >= MIN_ROWS:
        return keep
    others = [r for r in range(rows - 1, -1, -1) if r not in keep]
    return keep + tuple(others[:MIN_ROWS - len(keep)])
