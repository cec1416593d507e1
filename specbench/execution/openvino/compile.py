"""An IR compiled for this CPU: the properties every route shares, the static-shape copies a batch-1 call of a few
rows runs, and the memory budget that bounds how many of them are built."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from specbench.execution.openvino.attention import RECENT_INPUTS, RECENT_WINDOW
from specbench.models.loading import cache_dir

# float32 activations, never quantised on the fly: with OpenVINO's default dynamic quantisation (activations to int8 in
# groups before an int4 or int8 FC) a row's logits depend on the other rows of its call, and no row count or padding
# keeps them equal (experiments/openvino_same_model), so a verify on it is no lossless match for its plain decoding.
# That route is a format of its own, w4a8_g<group>: the int4_g<group> IR compiled with it on, in OpenVINO's groups of
# DYNAMIC_GROUP (what its GenAI engine runs); w4a8r_g<group> runs it row-invariant (route.py)
PROPERTIES = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
DYNAMIC_GROUP = 32
# batch-1 calls of at most STATIC_ROWS[-1] rows against at most STATIC_CONTEXTS[-1] cached tokens run a model compiled
# for their shape padded up to these (masked rows and keys): a dynamic-shape call of the CPU plugin prepares its nodes
# for the shape on every call, a static one does not (experiments/openvino_same_model). Each shape costs seconds to
# compile and a resident copy of the compiled weights, so a few: rows for plain decoding, a chain or a small tree, a
# 16-node tree; other calls (prefill, larger trees and contexts, batches) take the dynamic model. Compiled in this
# order while they fit in STATIC_MEMORY of the memory available at the build (a compile's resident cost, measured on
# the first)
STATIC_ROWS = (1, 16, 4, 8)
STATIC_CONTEXTS = (256, 512)
STATIC_MEMORY = 0.25
log = logging.getLogger(__name__)


def compiled(model, properties: dict = PROPERTIES):
    """`model` (an ov.Model or an IR's path) compiled for this CPU with PyTorch's thread count and `properties`, its
    blob cached under the specbench cache."""
    import openvino as ov

    core = ov.Core()
    core.set_property({"CACHE_DIR": str(cache_dir("openvino") / "compiled")})
    return core.compile_model(model, "CPU", properties | {"INFERENCE_NUM_THREADS": torch.get_num_threads()})


def static_models(xml: str, properties: dict, static_rows: tuple[int, ...] = STATIC_ROWS) -> dict:
    """(rows, context) -> the IR compiled for that static shape, in STATIC_CONTEXTS x `static_rows` order while the
    next one's resident cost (the largest seen so far) fits in what STATIC_MEMORY of the available memory leaves."""
    budget, models, cost = STATIC_MEMORY * (available_bytes() or math.inf), {}, 0
    start, resident = time.perf_counter(), resident_bytes()
    for shape in ((rows, context) for context in STATIC_CONTEXTS for rows in static_rows):
        if cost > budget:
            break
        before = resident_bytes()
        models[shape] = compiled(reshaped(xml, *shape), properties)
        grown = resident_bytes() - before
        budget, cost = budget - grown, max(cost, grown)
    log.info("openvino: %d of %d static shapes (rows, cached tokens) compiled in %.1f s, %d MiB resident: %s; other "
             "calls run the dynamic-shape model", len(models), len(static_rows) * len(STATIC_CONTEXTS),
             time.perf_counter() - start, (resident_bytes() - resident) // 2**20, sorted(models))
    return models


def available_bytes() -> int | None:
    """Memory the OS can give without swapping (Linux's MemAvailable; else free pages), None where unknown. Read by
    hand, as resident_bytes is: psutil does both, but it is no dependency of this project (installed here only
    through another package's requirements)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def resident_bytes() -> int:
    """The process's resident memory now (Linux's /proc/self/statm), else its peak (getrusage: kilobytes on Linux,
    bytes on macOS), which a compile moves only when it grows past it."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reshaped(xml: str, rows: int, context: int):
    """The IR at `xml` with every input of a static shape: batch 1, `rows` new rows, `context` cached tokens."""
    import openvino as ov

    model = ov.Core().read_model(xml)
    past, hidden = (model.input(name).get_partial_shape() for name in ("past", "inputs_embeds"))
    row_invariant = any(RECENT_INPUTS[0] in port.get_names() for port in model.inputs)
    shapes = {"inputs_embeds": [1, rows, hidden[2].get_length()],
              "attention_mask": [1, 1, rows, context + (0 if row_invariant else rows)], "position_ids": [1, rows],
              "past": [past[0].get_length(), 1, past[2].get_length(), context, past[4].get_length()]}
    model.reshape(shapes | ({name: [rows, RECENT_WINDOW] for name in RECENT_INPUTS} if row_invariant else {}))
    return model
