"""A weight format's route on ONNX Runtime: the builder's model of the target's float weights (export.py) run by
OnnxRuntimeForward; and the backend's settings, checked before any model loads."""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from specbench.errors import SpecbenchError
from specbench.execution.onnxruntime.export import FLOAT_GRAPH, PREFILL_GRAPH, BuildFailed, export, int8_sums_exact
from specbench.execution.onnxruntime.forward import OnnxRuntimeForward
from specbench.models.loading import LoadedModel
from specbench.models.shape import cache_problem

# model.weights -> the builder's precision: fp keeps float32 weights; int4 goes in groups of model.group_size; w8a8
# and w8a8s are the float graph quantised by export.w8a8_products
BUILDER_FORMATS = {"fp": "fp32", "int8": "int8"}
INSTALL = "a core dependency: pip install -e . installs onnxruntime-genai and onnx-ir"


def unsupported(dtype: torch.dtype, device: torch.device, weights: str = "fp") -> str | None:
    """None when ONNX Runtime can run this execution here, else why not (one line)."""
    if any(importlib.util.find_spec(m) is None for m in ("onnxruntime", "onnxruntime_genai", "onnx_ir")):
        return f"ONNX Runtime GenAI is not installed ({INSTALL})"
    if device.type != "cpu":
        return "the onnxruntime backend runs on the CPU"
    if dtype != torch.float32:
        return "the onnxruntime backend runs float32 activations (eval.dtype=float32)"
    if weights in FLOAT_GRAPH:  # the graph's premise, measured on this machine (export.int8_sums_exact)
        return int8_sums_exact()
    return weights_problem(weights)


def weights_problem(weights: str) -> str | None:
    """Why the builder cannot write these weights (a config or format name), None when it can."""
    head = weights.partition("_g")[0]
    if head not in ("fp", "int8", "int4", *FLOAT_GRAPH):
        return f"the onnxruntime backend runs the builder's weights (fp, int8, int4), w8a8 or w8a8s, not {head}"
    return None


def check_run(dtype: str, weights: str, batch_size: int = 1, config=None) -> None:
    """model.backend=onnxruntime's settings, before any model loads: installed, float32 (or auto) activations, the
    builder's weights, batch 1, full-attention layers when the model's config is known."""
    reason = unsupported(torch.float32, torch.device("cpu"), weights) or cache_problem(config)
    if reason:
        raise SpecbenchError(f"model.backend=onnxruntime with model.weights={weights}: {reason}")
    if dtype not in ("float32", "auto"):
        raise SpecbenchError(f"model.backend=onnxruntime with eval.dtype={dtype}: it runs float32 activations; set "
                             f"eval.dtype=float32")
    if batch_size != 1:
        raise SpecbenchError(f"model.backend=onnxruntime with eval.batch_size={batch_size}: it decodes one prompt at a "
                             f"time; set eval.batch_size=1")


def builder_format(weights: str) -> str:
    """The folder name of a route's weights: the builder's (fp32, int8, int4_g<group>), w8a8 or w8a8s."""
    return BUILDER_FORMATS.get(weights, weights)


def with_onnxruntime(target: LoadedModel, weights: str) -> LoadedModel:
    """`target`'s float weights built (once per machine) into ONNX Runtime GenAI's model in `weights`, run with
    PyTorch's thread count."""
    problem = cache_problem(target.model.config)
    if problem:
        raise SpecbenchError(f"model.backend=onnxruntime cannot run {target.name}: {problem}")
    if target.weights != "fp" or target.backend != "eager":
        raise SpecbenchError(f"model.backend=onnxruntime builds from the float weights itself; it was given a target "
                             f"with weights {target.weights} on backend {target.backend}: give it the eager float model")
    try:
        folder = export(target, builder_format(weights))
    except BuildFailed as exc:
        raise SpecbenchError(f"model.backend=onnxruntime cannot run {target.name}: {exc}") from None
    prefill = folder / PREFILL_GRAPH
    forward = OnnxRuntimeForward(target.model, str(folder / "verify.onnx"), torch.get_num_threads(),
                                 chains_only=weights != "fp", prefill_path=str(prefill) if prefill.exists() else None)
    return dataclasses.replace(target, model=forward, backend="onnxruntime", weights=weights)
