"""Execution backends: the same transformers model and cache, run with less overhead per forward.

- `eager`: transformers as it is, the reference every other backend is checked against.
- `prepacked`: every nn.Linear keeps its weight in oneDNN's blocked layout, reordered once at load. Eager GEMM
  repacks each weight on every call, which is what makes an n = 2 forward cost far more than n = 1 on CPU.
- `openvino`: the forward run by OpenVINO's CPU runtime from an IR exported once per machine, its weights
  compressed by NNCF (execution/openvino/); applied by Execution.apply, which hands it the float weights.
- `onnxruntime`: the forward run by ONNX Runtime on the graph ONNX Runtime GenAI's builder writes once per machine,
  its weights quantised by the builder (execution/onnxruntime/); applied like openvino.
- `compile`: torch.compile (inductor) of the model's forward with shapes dynamic in the tree size and the cache
  length, so one graph serves every one-token step and one every multi-row verify, and on CPU with freezing, which
  turns the weights into constants that inductor prepacks and folds (dynamo's prepare_freezing, see `_compiled`). It
  removes most of a small model's per-layer host and small-op time (norms, rotary, residual adds fused into a few
  kernels). Compile time is paid on the first forwards and reported apart (`compile_seconds`); inductor caches
  compiled graphs across processes.
- `graphs`: the forward over a static KV cache, captured as one CUDA graph per row bucket and replayed
  (execution/graphs.py): a step is one graph launch, not a few hundred kernel launches from Python. CUDA only.

`auto` is not a backend: the evaluator resolves it from the machine profile (hardware/measured/machine_profile.py).
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch
from torch import nn

from specbench.errors import SpecbenchError
from specbench.execution import graphs, onnxruntime, openvino
from specbench.execution.linears import fuse_projections, replace_linears
from specbench.models.loading import LoadedModel
from specbench.models.shape import cache_problem

BACKENDS = ("eager", "prepacked", "compile", "openvino", "onnxruntime", graphs.GRAPHS)
OPENVINO = "openvino"
ONNXRUNTIME = "onnxruntime"
# the backends that build their own graph from the float weights and quantise them themselves (Execution.apply hands
# them the eager float model; their drafters' derived models stay eager)
OWN_GRAPH = (OPENVINO, ONNXRUNTIME)
AUTO = "auto"
# keys of a `model` config that say how the loaded model runs: the task applies them after loading (and after the
# machine profile has chosen), so they are no arguments of the loaders
RUN_KEYS = ("backend", "weights", "group_size", "attention")


def check_backend(name: str) -> None:
    if name != AUTO and name not in BACKENDS:
        raise SpecbenchError(f"model.backend='{name}' is unknown; valid choices: {AUTO}, {', '.join(BACKENDS)}")


def check_profile_backends(names) -> list[str]:
    """eval.profile_backends as a list: the backends auto chooses among, at least one, auto itself not one."""
    names = list(names)
    bad = [n for n in names if n not in BACKENDS]
    if not names or bad:
        raise SpecbenchError(f"eval.profile_backends={names} is invalid: give one or more of {', '.join(BACKENDS)}")
    return names


def or_eager(backends: list[str], device: torch.device, config) -> list[str]:
    """`backends` for model.backend=auto to choose among, with eager added where none of them can run this model at
    all (the own-graph routes refuse a sliding-window cache): transformers' own forward runs every model."""
    if all(supported(b, torch.float32, device, config) is not None for b in backends):  # each says why not
        return [*backends, "eager"]
    return list(backends)


def supported(backend: str, dtype: torch.dtype, device: torch.device, config=None) -> str | None:
    """None when `backend` can run `dtype` on `device` (and the model of `config`, when given), else why not (one
    line)."""
    check_backend(backend)
    problem = cache_problem(config) if backend in OWN_GRAPH else None
    if problem:
        return problem
    if backend == OPENVINO:
        return openvino.unsupported(dtype, device)
    if backend == ONNXRUNTIME:
        return onnxruntime.unsupported(dtype, device)
    if backend == graphs.GRAPHS:
        return graphs.unsupported(device)
    if backend == "prepacked":
        if device.type != "cpu":
            return "prepacked oneDNN linears are a CPU backend"
        try:  # oneDNN itself knows which ISA its packed bf16/fp16 kernels need
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype))
        except RuntimeError as exc:
            return f"oneDNN cannot pack {dtype} weights on this CPU ({str(exc).splitlines()[0]})"
    return None


class PackedLinear(nn.Module):
    """nn.Linear whose weight is reordered once into oneDNN's layout. The original parameter stays reachable as
    `.weight` (a tied LM head, Medusa's heads and the memory accounting read it); only the packed copy is used."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach()),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return nn.functional.linear(x, self.weight, self.bias)  # the packed op has no backward
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


@dataclasses.dataclass
class Compiled:
    """Wall time of the forwards that compiled a graph (the first of each new shape family)."""

    seconds: float = 0.0
    graphs: int = 0


def with_backend(target: LoadedModel, backend: str, fuse: bool = True) -> LoadedModel:
    """`target` run by `backend`, on a shallow copy of its module tree for prepacked (the original keeps its plain
    linears; the weights are shared) and a wrapped forward for compile. eager returns target itself."""
    check_backend(backend)
    if backend == AUTO:
        raise SpecbenchError("model.backend=auto is resolved by the evaluator from the machine profile; "
                             "with_backend needs one of: " + ", ".join(BACKENDS))
    if backend == "eager" or target.backend == backend:
        return target
    if backend == OPENVINO:  # it refuses a quantised target itself
        return openvino.with_openvino(target, "fp")
    if backend == ONNXRUNTIME:
        return onnxruntime.with_onnxruntime(target, "fp")
    if target.backend != "eager":
        raise SpecbenchError(f"the model already runs on backend '{target.backend}'; apply '{backend}' to the "
                             f"eager model")
    model = target.model
    weight = next(model.parameters())  # a drafter's head is a plain nn.Module, without a model's .dtype and .device
    reason = supported(backend, weight.dtype, weight.device)
    if reason:
        raise SpecbenchError(f"model.backend={backend} cannot run {weight.dtype} here: {reason}; use eager or "
                             f"another dtype")
    if backend == "prepacked":
        model = _prepacked(model, fuse)
    elif backend == graphs.GRAPHS:
        model = graphs.with_graphs(model)
    else:
        model = _compiled(model, weight.device)
    return dataclasses.replace(target, model=model, backend=backend)


def _prepacked(model: nn.Module, fuse: bool = True) -> nn.Module:
    """Projections that share an input fused (one packed GEMM each, execution/linears.py; fuse=False keeps them apart,
    which task=profile times against), then every linear packed, on views down every path to a linear (the leaves
    and other modules stay shared)."""
    return replace_linears(fuse_projections(model) if fuse else model, PackedLinear)


def _compiled(model: nn.Module, device: torch.device) -> nn.Module:
    """Decode steps and verifies run compiled; a prefill (an empty cache) runs the eager forward, as it is one call
    per prompt and would cost a graph of its own. Cached keys and values are made contiguous before each compiled call:
    a prefill's keys are a transposed view and a cropped cache a slice, and each new stride pattern is a new graph
    (dynamo guards on strides), where a copy of a 135M model's cache costs well under a millisecond."""
    clone = copy.copy(model)  # only its forward is replaced
    # Each call signature (a one-token step, a chain, a tree mask, with or without hidden states) gets a graph of its
    # own before dynamo generalises; more than its default limit of 8.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    freeze = device.type == "cpu"
    compiled = torch.compile(model.forward, dynamic=True, options={"freezing": freeze})
    stats = Compiled()

    def forward(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        if cache is None or cache.get_seq_length() == 0:
            return model.forward(*args, **kwargs)
        for layer in cache.layers:
            initialized = getattr(layer, "is_initialized", False)
            if initialized and not (layer.keys.is_contiguous() and layer.values.is_contiguous()):
                layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        # Dynamo inlines nn.Modules and lifts their weights to graph inputs, so inductor's freezing finds no
        # parameters to freeze unless dynamo installs them on the graph as it traces (prepare_freezing, scoped to
        # this model's calls). Without it `freezing` does nothing, and the weights are not packed into oneDNN's
        # constants that make a compiled step fast (experiments/fast_forward).
        with torch._dynamo.config.patch(prepare_freezing=freeze):
            out = compiled(*args, **kwargs)
        new = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
        if new:
            stats.seconds += time.perf_counter() - start
            stats.graphs += new
        return out

    clone.forward = forward
    clone.compile_stats = stats
    return clone
