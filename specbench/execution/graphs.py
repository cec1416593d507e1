"""The `graphs` backend: a causal LM's forward over a static KV cache, captured once per row count as a CUDA graph and
replayed, so a step costs one graph launch instead of a few hundred kernel launches driven from Python.

Why: a small model's eager forward on a GPU is almost all host work (Python, the dynamic cache, one launch per op;
experiments/gpu), so every ratio measured on it is the host's. vLLM and gpt-fast decode on captured graphs over a static
cache; this is that, for transformers' own model files (nothing forked) and the decode loop every method runs.

How a forward runs (`StaticForward`):
- its cache is a `SlotCache` (execution/static_cache.py), allocated once and handed out by `new_cache` (verification's
  `new_cache` asks for it), so a captured graph finds its keys and values at the same addresses on every replay;
- a call of n rows is padded to the smallest bucket B >= n of BUCKETS, so a handful of graphs serve every tree size
  and plain step: the padded rows see only their own slot, write past the n real rows (stale slots, masked) and their
  outputs are dropped. A real row never sees a padded one, so its outputs are those of the unpadded call;
- the graph's inputs are static tensors the host fills before each replay: token ids (or embeddings: PPD's extra
  rows), position ids, the (B, capacity) boolean mask over every cache slot, and the slots the rows are written to.
  The mask and positions come from the caller as for any model (verify_tree's 4D tree mask, or none for a causal
  chain), so verification and every drafter run unchanged;
- one graph per (bucket, ids or embeddings, hidden states asked for): the first call of a kind captures every
  bucket of it (`capture`: a warm-up forward on a side stream first, as torch.cuda.graph asks), so an untimed warm-up
  generation captures what the timed ones replay, however their tree sizes vary; the capture time is reported as
  `compile_stats`, like compile's;
- a call of more rows than the largest bucket (a prefill) runs the same forward uncaptured; so does everything on
  a machine without CUDA (`capture=False`), which is how the static-cache path is tested on the CPU;
- a forward on any other cache (a drafter's own DynamicCache, a batched verify) or on none runs the module's own
  forward: a drafter's network under this backend runs eager until it captures its own calls the same way.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from specbench.errors import SpecbenchError
from specbench.execution.static_cache import SlotCache

GRAPHS = "graphs"
BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # rows a captured forward takes: plain steps and trees up to the profile's largest
CAPACITY = 2048  # slots first allocated; the cache doubles when a call needs more (and its graphs are captured again)
T = TypeVar("T")


def unsupported(device: torch.device) -> str | None:
    """None where graphs can be captured on `device`, else why not (one line)."""
    if device.type != "cuda":
        return f"CUDA graphs are captured on a CUDA device, and this model is on {device.type}"
    return None


def check_run(backend: str, device: str, batch_size: int) -> None:
    """One error line for model.backend=graphs where it cannot run, before any model loads: the run's device
    (hw.device) is no CUDA device (hw.device=cuda on a machine without one is hw's own error), or several sequences
    decode together (a batched verify runs on a DynamicCache, which would run eager under this backend's name)."""
    if backend != GRAPHS:
        return
    if not (str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available())):
        raise SpecbenchError(f"model.backend=graphs replays CUDA graphs, so it needs a CUDA device (hw=cuda); "
                             f"hw.device='{device}' runs on the CPU here: use model.backend=eager, prepacked, compile "
                             f"or openvino")
    if batch_size != 1:
        raise SpecbenchError(f"model.backend=graphs decodes one sequence at a time; eval.batch_size={batch_size} is "
                             f"invalid with it: use eval.batch_size=1, or model.backend=eager or compile")


def capture(body: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """`body`'s kernels captured as one CUDA graph, and what it returned: tensors each replay overwrites. body must
    read and write only tensors that outlive the graph (inputs filled before each replay, a preallocated cache). It
    runs once on a side stream first, as torch.cuda.graph asks, so lazy initialisations (cuBLAS workspaces) happen
    outside the capture. The target's forward is captured with it; a drafter's network can be the same way."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = body()
    return graph, outputs


@functools.cache
def _causal(rows: int, device: torch.device) -> torch.Tensor:
    return torch.ones(rows, rows, dtype=torch.bool, device=device).tril()


class Captured:
    """Wall time of the captures (warm-up forward included) and how many graphs were captured."""

    def __init__(self) -> None:
        self.seconds, self.graphs = 0.0, 0


class StaticForward:
    """A causal LM's forward over its own SlotCache, captured per bucket (capture=True, CUDA) or run as is."""

    def __init__(self, model: nn.Module, capture: bool, capacity: int = CAPACITY) -> None:
        self.module, self.eager = model, model.forward  # bound to the original module: the eager forward
        self.capture, self.capacity = capture, capacity
        self.cache: SlotCache | None = None
        self.inputs: dict[tuple, dict[str, torch.Tensor]] = {}  # (bucket, embeds) -> the graph's input tensors
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple]] = {}  # (bucket, embeds, hidden) -> graph, outputs
        self.stats = Captured()

    def new_cache(self) -> SlotCache:
        """The one cache this forward runs on, emptied: one decode at a time uses it."""
        if self.cache is None:
            self.cache = SlotCache(self.module.config, self.capacity)
        self.cache.reset()
        return self.cache

    def __call__(self, *args, **kwargs):
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if args or cache is None or cache is not self.cache:
            return self.eager(*args, **kwargs)
        with torch.inference_mode():
            return self._static(**kwargs)

    def _static(self, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None,
                output_hidden_states=False, use_cache=True, past_key_values=None, cache=None, logits_to_keep=0,
                **rest):
        x = input_ids if inputs_embeds is None else inputs_embeds
        if not isinstance(logits_to_keep, int):
            raise SpecbenchError(f"model.backend=graphs keeps the logits of a call's last k rows (logits_to_keep=k, "
                                 f"0 for all), not of the rows a {type(logits_to_keep).__name__} names")
        if rest or x.shape[0] != 1:
            raise SpecbenchError(f"model.backend=graphs runs one sequence per forward with ids or embeddings, a mask, "
                                 f"positions and its own cache; this call has batch {x.shape[0]} and "
                                 f"{sorted(rest) or 'no other'} arguments: use eval.batch_size=1")
        rows, past = x.shape[1], self.cache.length
        if attention_mask is not None and (attention_mask.dtype != torch.bool
                                           or tuple(attention_mask.shape) != (1, 1, rows, past + rows)):
            raise SpecbenchError(f"model.backend=graphs takes a (1, 1, {rows}, {past + rows}) boolean mask over the "
                                 f"cache and the new rows (verify_tree's), not {attention_mask.dtype} "
                                 f"{tuple(attention_mask.shape)}")
        bucket = next((b for b in BUCKETS if b >= rows), rows)
        captured = self.capture and bucket in BUCKETS
        if past + bucket > self.cache.capacity:
            self._grow(past + bucket)
        hidden = (bool(output_hidden_states) if output_hidden_states is None or isinstance(output_hidden_states, bool)
                  else tuple(output_hidden_states))  # True, False or the indices kept: a graph's key
        embeds = inputs_embeds is not None
        if captured and (bucket, embeds, hidden) not in self.graphs:
            self._capture_all(x, embeds, hidden, past)
        inputs = self._inputs(bucket, embeds, x)
        self._fill(inputs, x, attention_mask, position_ids, rows, past)
        if captured:
            graph, (logits, states) = self.graphs[bucket, embeds, hidden]
            graph.replay()  # its outputs are overwritten by its next replay: copied out below
        else:
            logits, states = self._body(inputs, hidden)
        self.cache.length = past + rows
        first = rows - logits_to_keep if logits_to_keep else 0  # transformers' int form: the last k rows (0: all)
        return CausalLMOutputWithPast(logits=logits[:, first:rows].clone() if captured else logits[:, first:rows],
                                      hidden_states=None if states is None else _rows(states, rows, captured))

    def _inputs(self, bucket: int, embeds: bool, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The input tensors of a bucket's graphs (kept: the graphs read them), or fresh ones for an uncaptured
        prefill. Zeros to start with, so a padded row's token and position are valid."""
        key = (bucket, embeds)
        if key in self.inputs and bucket in BUCKETS:
            return self.inputs[key]
        device = x.device
        inputs = {"x": torch.zeros((1, bucket, *x.shape[2:]), dtype=x.dtype, device=device),
                  "positions": torch.zeros(1, bucket, dtype=torch.long, device=device),
                  "mask": torch.zeros(bucket, self.cache.capacity, dtype=torch.bool, device=device),
                  "slots": torch.zeros(bucket, dtype=torch.long, device=device)}
        if bucket in BUCKETS:
            self.inputs[key] = inputs
        return inputs

    @staticmethod
    def _fill(inputs: dict[str, torch.Tensor], x: torch.Tensor, attention_mask, position_ids, rows: int,
              past: int) -> None:
        """The call's rows into the graph's inputs; the padded rows (rows..bucket) keep their old finite tokens and
        positions and see only their own slot."""
        bucket = inputs["slots"].shape[0]
        inputs["x"][:, :rows].copy_(x)
        torch.arange(past, past + bucket, out=inputs["slots"])
        if position_ids is None:
            torch.arange(past, past + rows, out=inputs["positions"][0, :rows])
        else:
            inputs["positions"][:, :rows].copy_(position_ids)
        mask = inputs["mask"]
        mask.zero_()
        if attention_mask is None:  # causal: every cached slot, then the rows up to and including itself
            mask[:rows, :past] = True
            mask[:rows, past: past + rows] = _causal(rows, mask.device)
        else:
            mask[:rows, : past + rows].copy_(attention_mask[0, 0])
        if bucket > rows:
            mask[rows:, past + rows: past + bucket].fill_diagonal_(True)

    def _body(self, inputs: dict[str, torch.Tensor], hidden) -> tuple[torch.Tensor, tuple | None]:
        """The forward a graph captures: transformers' own, over the SlotCache, at the given slots."""
        self.cache.slots = inputs["slots"]
        ids_or_embeds = {"inputs_embeds" if inputs["x"].is_floating_point() else "input_ids": inputs["x"]}
        out = self.eager(**ids_or_embeds, attention_mask=inputs["mask"][None, None],
                         position_ids=inputs["positions"], past_key_values=self.cache, use_cache=True,
                         output_hidden_states=hidden)
        return out.logits, out.hidden_states if hidden else None

    def _capture_all(self, x: torch.Tensor, embeds: bool, hidden, past: int) -> None:
        """A graph for every bucket of this kind of call, each captured over placeholder rows (zeros, causal after
        the committed slots) written past them: stale slots, which the call's own rows then overwrite."""
        start = time.perf_counter()
        if past + BUCKETS[-1] > self.cache.capacity:  # every bucket's placeholder rows go after the committed ones
            self._grow(past + BUCKETS[-1])
        for bucket in BUCKETS:
            if (bucket, embeds, hidden) in self.graphs:
                continue
            inputs = self._inputs(bucket, embeds, x)
            inputs["x"].zero_()
            self._fill(inputs, inputs["x"], None, None, bucket, past)
            self.graphs[bucket, embeds, hidden] = capture(lambda: self._body(inputs, hidden))  # noqa: B023
            self.stats.graphs += 1
        torch.cuda.synchronize()
        self.stats.seconds += time.perf_counter() - start

    def _grow(self, needed: int) -> None:
        """A cache of the next power of two >= needed slots; the graphs and inputs of the old addresses are dropped."""
        self.cache.grow(1 << (needed - 1).bit_length())
        self.inputs.clear()
        self.graphs.clear()


def _rows(states: tuple, rows: int, copy: bool) -> tuple:
    """The hidden states (None where a state was not selected) cut to the call's rows; copied out of a graph's
    outputs in one stacked copy rather than one per layer."""
    kept = [i for i, state in enumerate(states) if state is not None]
    cut = [states[i][:, :rows] for i in kept]
    if copy and cut:
        cut = list(torch.stack(cut).unbind())
    out = [None] * len(states)
    for i, state in zip(kept, cut):
        out[i] = state
    return tuple(out)


def with_graphs(model: nn.Module, capture: bool | None = None, capacity: int = CAPACITY) -> nn.Module:
    """A shallow copy of `model` whose forward is a StaticForward (the original keeps its own; weights shared),
    capturing graphs where the model is on a CUDA device (capture=None) and running the same forward elsewhere."""
    if capture is None:
        capture = next(model.parameters()).device.type == "cuda"
    clone = copy.copy(model)
    clone.forward = StaticForward(model, capture, capacity)
    clone.compile_stats = clone.forward.stats
    return clone
