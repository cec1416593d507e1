"""The Execution value: what a target runs as -- backend, activation dtype, weight format -- and its one label.

Every log line, record column, machine-profile key and plot names an execution by the same label,
backend/dtype with /weights after them for a quantised target (eager/bfloat16, prepacked/float32/int4_g32). It is a
tuple, so the profile's (backend, dtype, weights) keys and a run's record columns compare with it unchanged. The
attention kernel is not part of it: execution/attention.py chooses SDPA or eager attention by context length for any
execution, and a profile is keyed by that choice apart.
"""

from __future__ import annotations

from typing import NamedTuple

from specbench.errors import SpecbenchError
from specbench.execution.backends import BACKENDS, ONNXRUNTIME, OPENVINO, OWN_GRAPH, with_backend
from specbench.execution.onnxruntime import INT4_GROUPS, with_onnxruntime
from specbench.execution.openvino import group_error, with_openvino
from specbench.execution.quantize import (FORMATS, GROUP_SIZES, backend_problem, format_name, owning_backend,
                                          split_format, with_weights)
from specbench.models.loading import DTYPES, LoadedModel, with_dtype


class Execution(NamedTuple):
    backend: str  # execution/backends.py: eager, prepacked, compile, openvino
    dtype: str  # float32, bfloat16, float16
    weights: str = "fp"  # execution/quantize.py: fp, int8, int4_g<group>, w8a8

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.dtype}" + ("" if self.weights == "fp" else f"/{self.weights}")

    @classmethod
    def parse(cls, text: str, group_size: int = 32) -> Execution:
        """An eval.plain_executions entry: backend/dtype or backend/dtype/weights (weights fp, int8, w8a8, int4 with
        model.group_size, or int4_g<group>; w4a8 and w4a8r on openvino only, w8a8s on onnxruntime only)."""
        parts = str(text).split("/")
        ok = len(parts) in (2, 3) and parts[0] in BACKENDS and parts[1] in DTYPES
        if ok and len(parts) == 3:
            weights, group = split_format(parts[2], group_size)
            groups = {OPENVINO: lambda g: group_error(g) is None, ONNXRUNTIME: INT4_GROUPS.__contains__}  # their own
            grouped = groups.get(parts[0], GROUP_SIZES.__contains__)(group)
            ok = weights in FORMATS and grouped
        if not ok:
            raise SpecbenchError(f"eval.plain_executions entry '{text}' is invalid: give backend/dtype[/weights] with "
                                 f"a backend of {', '.join(BACKENDS)}, a dtype of {', '.join(DTYPES)} and weights of "
                                 f"{', '.join(FORMATS)} (int4_g<group> for another group size), e.g. eager/bfloat16/int8")
        weights = format_name(*split_format(parts[2], group_size)) if len(parts) == 3 else "fp"
        reason = backend_problem(weights, parts[0])
        if reason:
            raise SpecbenchError(f"eval.plain_executions entry '{text}' is invalid: {reason}; give "
                                 f"{owning_backend(weights)}/float32/{weights}")
        return cls(parts[0], parts[1], weights)

    def apply(self, target: LoadedModel) -> LoadedModel:
        """`target` (loaded eager, any dtype) quantised to these weights, cast to this dtype, on this backend. The
        openvino and onnxruntime backends quantise the float weights themselves (NNCF's grid, the builder's), so they
        are handed them."""
        if self.backend in OWN_GRAPH:
            if self.dtype != "float32":
                raise SpecbenchError(f"{self.label}: the {self.backend} backend runs float32 activations "
                                     f"(eval.dtype=float32)")
            route = with_openvino if self.backend == OPENVINO else with_onnxruntime
            return route(target, self.weights)
        return with_backend(with_dtype(with_weights(target, self.weights), self.dtype), self.backend)
