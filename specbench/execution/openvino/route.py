"""A weight format's route on OpenVINO: which IR it exports, how it compiles it, which forward runs it and what that
forward claims of a verify's rows."""

from __future__ import annotations

import dataclasses
import logging

import torch

from specbench import openmp
from specbench.errors import SpecbenchError
from specbench.execution.openvino.attention import ATTENTION, PREFILL_ATTENTION, ROW_INVARIANT_ATTENTION
from specbench.execution.openvino.compile import (DYNAMIC_GROUP, PROPERTIES, STATIC_ROWS, StaticModels, compiled,
                                                  quantises_activations, row_models)
from specbench.execution.openvino.export import exported
from specbench.execution.openvino.forward import ROW_INVARIANT_MIN_ROWS, OpenVinoForward
from specbench.execution.openvino.settings import OWN_FORMATS, group_problem, unsupported
from specbench.execution.row_claims import BITWISE, DIFFERS, ROUNDING
from specbench.models.loading import LoadedModel, with_dtype
from specbench.models.shape import cache_problem

log = logging.getLogger(__name__)


def with_openvino(target: LoadedModel, weights: str) -> LoadedModel:
    """`target`'s float weights exported (once per machine) to an OpenVINO IR in `weights`, compiled for this CPU
    with PyTorch's thread count and float32 inference."""
    reason = unsupported(torch.float32, next(target.model.parameters()).device, weights)
    if reason:
        raise SpecbenchError(f"model.backend=openvino cannot run here: {reason}")
    problem = cache_problem(target.model.config)
    if problem:
        raise SpecbenchError(f"model.backend=openvino cannot run {target.name}: {problem}")
    problem = group_problem(target.model.config, weights)
    if problem:
        raise SpecbenchError(f"model.backend=openvino cannot compress {target.name} to {weights}: {problem}")
    if target.weights != "fp" or target.backend != "eager":
        raise SpecbenchError(f"model.backend=openvino compresses the float weights itself; it was given a target with "
                             f"weights {target.weights} on backend {target.backend}: give it the eager float model "
                             f"(Execution('openvino', 'float32', '{weights}').apply does)")
    if not openmp.SHORT_SPIN:
        log.warning("model.backend=openvino: torch was loaded before specbench, so its OpenMP threads spin on the "
                    "cores OpenVINO's run on, which lengthens every step: import specbench before torch or set "
                    "GOMP_SPINCOUNT=%s (specbench/openmp.py, experiments/openvino_engine_speed)", openmp.SPIN_COUNT)
    fp32 = with_dtype(target, "float32")
    head, _, group = weights.partition("_g")
    # w4a8 and w4a8r compile the int4 IR (w4a8r's traces recent_attention) with activations quantised on the fly
    stored = f"int4_g{group}" if head in OWN_FORMATS else weights
    row_invariant = head == "w4a8r"
    properties = PROPERTIES | ({"DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNAMIC_GROUP} if stored != weights else {})
    claims = claim(weights)
    if row_invariant and claim(f"w4a8_g{group}") != DIFFERS:
        log.warning("model.weights=%s: OpenVINO quantises no activations on this CPU (its dynamic quantisation needs "
                    "int8 dot products, VNNI or AMX), so this route computes %s's numbers in a slower layout; "
                    "model.weights=%s is the faster lossless route here", weights, stored, stored)
    xml = exported(fp32, stored, ROW_INVARIANT_ATTENTION if row_invariant else ATTENTION)
    rows = tuple(max(r, ROW_INVARIANT_MIN_ROWS) for r in STATIC_ROWS) if row_invariant else STATIC_ROWS
    # A prompt on an empty cache is the same call in a method's run as in its plain decoding, so its rows need not be
    # computed as any other call's: one that no compiled row count holds runs in one call of the prefill IR (its
    # attention one fused SDPA over the prompt's rows, faster than split_attention's blocks at every length measured:
    # experiments/openvino_engine_speed), w4a8r's too instead of pieces of RECENT_DEPTH rows, and the steps after it
    # read the keys and values it cached, as plain decoding's do (experiments/openvino_row_invariant). The cost: that
    # IR exported once and compiled beside the route's.
    prefill = OpenVinoForward(fp32.model, compiled(exported(fp32, stored, PREFILL_ATTENTION), properties),
                              claims=claims)
    # w4a8r keeps its row models: its bitwise claim was measured on them (experiments/openvino_row_invariant)
    static = None if row_invariant else StaticModels(xml, properties)
    forward = OpenVinoForward(fp32.model, compiled(xml, properties), row_models(xml, properties, rows), claims,
                              row_invariant, prefill, static)
    return dataclasses.replace(target, model=forward, backend="openvino", weights=weights)


def claim(weights: str) -> str:
    """What the route of `weights` promises of a verify's rows against plain decoding's: BITWISE for w4a8r (its
    calls and attention laid out so), DIFFERS for w4a8 where this CPU quantises activations per call, ROUNDING for
    float activations (fp, int8, int4, and w4a8 where no activation is quantised)."""
    head = weights.partition("_g")[0]
    if head == "w4a8r":
        return BITWISE
    if head == "w4a8" and quantises_activations():
        return DIFFERS
    return ROUNDING
