"""An IR compiled for this CPU: the properties every route shares, the static-shape copies a batch-1 call of a few
rows runs, and the memory budget that bounds how many of them are built."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from specbench.execution.openvino.attention import RECENT_INPUTS, RECENT_WINDOW
from specbench.errors import SpecbenchError
from specbench.models.loading import cache_dir

# float32 activations, never quantised on the fly: with OpenVINO's default dynamic quantisation (activations to int8 in
# groups before an int4 or int8 FC) a row's logits depend on the other rows of its call, and no row count or padding
# keeps them equal (experiments/openvino_same_model), so a verify on it is no lossless match for its plain decoding.
# That route is a format of its own, w4a8_g<group>: the int4_g<group> IR compiled with it on, in OpenVINO's groups of
# DYNAMIC_GROUP (what its GenAI engine runs); w4a8r_g<group> runs it row-invariant (route.py)
PROPERTIES = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
DYNAMIC_GROUP = 32
# batch-1 calls of at most STATIC_ROWS[-1] rows run a model compiled for that many rows (the call's padded up to it:
# masked rows), its context dynamic: the CPU plugin prepares a node for its input shapes when they change, and a
# kernel compiled for a static row count runs faster than the dynamic model's at the same shape
# (experiments/openvino_engine_speed), while the context moves only the attention's shapes, in steps of the cache
# buffer's capacity (cache_views.CACHE_STEP). Each costs seconds to compile and a resident copy of the compiled weights,
# so a few: rows for plain decoding, a 16-node tree, a chain or a small tree; other calls (prefill, larger trees,
# batches) take the dynamic model. Compiled in this order while they fit in STATIC_MEMORY of the memory available at
# the build (a compile's resident cost, measured on the first)
STATIC_ROWS = (1, 16, 4, 8)
STATIC_MEMORY = 0.25
# a batch-1 call on a cache buffer of at most STATIC_CONTEXT slots runs a model with every shape static (StaticModels)
# at the fewest of SIZED_ROWS rows that hold it, compiled per row count and capacity as the run reaches them; longer
# contexts run the row models. Its row counts are finer than STATIC_ROWS' because only those a run meets are built:
# a verify's cost grows with every row on a CPU (experiments/openvino_engine_speed), and drafts of 2 or 3 nodes (a
# chain of 2, PLD's and suffix decoding's short matches) would pay for 4 rows
STATIC_CONTEXT = 4096
SIZED_ROWS = (1, 2, 3, 4, 8, 16)
STATIC_FLOOR = 0.5
# the compiled-blob cache kept under this many bytes: each IR a run meets leaves a blob of its weights per row model,
# and an IR of another export key (a new version, layout or weight format) never reads the old ones, so without a
# bound the blobs of every past export stay, until they fill the disk (experiments/first_look)
COMPILED_BUDGET = 4 * 2**30
log = logging.getLogger(__name__)


def compiled_cache() -> Path:
    """The compiled-blob cache of the cache root in force, pruned to COMPILED_BUDGET the first time a process uses it
    (prune_blobs)."""
    folder = cache_dir("openvino") / "compiled"
    if folder not in _PRUNED:
        prune_blobs(folder, COMPILED_BUDGET)
        _PRUNED.add(folder)
    return folder


_PRUNED: set[Path] = set()


def prune_blobs(folder: Path, budget: int) -> None:
    """The oldest blobs in `folder` (by modification time) removed until the rest fit `budget` bytes: a blob removed
    that a later run wants is compiled again (seconds), where one kept is disk held for good."""
    blobs = sorted((p for p in folder.glob("*.blob") if p.is_file()), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in blobs)
    for blob in blobs:
        if total <= budget:
            break
        size = blob.stat().st_size
        with contextlib.suppress(OSError):  # another process removed or holds it
            blob.unlink()
            total -= size


def compiled(model, properties: dict = PROPERTIES, cached: bool = True):
    """`model` (an ov.Model or an IR's path) compiled for this CPU with PyTorch's thread count and `properties`, its
    blob cached under the specbench cache where `cached`."""
    import openvino as ov

    core = ov.Core()
    with contextlib.suppress(SpecbenchError):  # a read-only cache: compiled every run, not cached
        if cached:
            core.set_property({"CACHE_DIR": str(compiled_cache())})
    return core.compile_model(model, "CPU", properties | {"INFERENCE_NUM_THREADS": torch.get_num_threads()})


class StaticModels:
    """The models of one IR with every shape static, one per (rows, cache capacity) as a forward meets them. The CPU
    plugin runs a static graph without re-inferring each node's shapes per call, which made the context-dynamic row
    models' steps longer (experiments/openvino_engine_speed). Each holds its own copy of the weights, as a row model
    does, so only sizes a run reaches are compiled, and only while the memory left after one more stays above
    STATIC_FLOOR of the machine's, whichever routes hold the rest (a run builds several: its target, other executions'
    plain decoding, the profile's); a size past that or past `context` slots runs the row model."""

    def __init__(self, xml: str, properties: dict, context: int = STATIC_CONTEXT) -> None:
        self.xml, self.properties, self.context = xml, properties, context
        self.requests: dict[tuple[int, int], object] = {}
        self.cost = 0  # the most resident memory one compile took
        self.full = False  # the floor was reached: no more compiles

    def request(self, rows: int, capacity: int):
        """The infer request of the static model of `rows` rows on a cache buffer of `capacity` slots, compiled now
        if it is new; None where it is past `context` or the memory floor."""
        key = (rows, capacity)
        if key in self.requests or self.full or not 0 < capacity <= self.context:
            return self.requests.get(key)
        available, total = available_bytes(), total_bytes()
        if available is not None and total is not None and available - self.cost < STATIC_FLOOR * total:
            self.full = True
            log.info("openvino: %d static models built; %d MiB of memory left, so other sizes run the row models",
                     len(self.requests), available // 2**20)
            return None
        model = reshaped(self.xml, rows, capacity)
        before = resident_bytes()
        # not cached: a blob is a copy of the weights on disk, one per size, and one run builds a dozen sizes; a
        # compile from the IR takes a few times an import's second, untimed (experiments/openvino_engine_speed)
        self.requests[key] = compiled(model, self.properties, cached=False).create_infer_request()
        self.cost = max(self.cost, resident_bytes() - before)
        return self.requests[key]

    def rows_seen(self) -> set[int]:
        """The row counts compiled so far."""
        return {rows for rows, _ in self.requests}


def row_models(xml: str, properties: dict, static_rows: tuple[int, ...] = STATIC_ROWS) -> dict:
    """rows -> the IR compiled for batch 1 and that many rows (context dynamic), in `static_rows` order while the next
    one's resident cost (the largest seen so far) fits in what STATIC_MEMORY of the available memory leaves."""
    budget, models, cost = STATIC_MEMORY * (available_bytes() or math.inf), {}, 0
    start, resident = time.perf_counter(), resident_bytes()
    for rows in static_rows:
        if cost > budget:
            break
        before = resident_bytes()
        models[rows] = compiled(reshaped(xml, rows), properties)
        grown = resident_bytes() - before
        budget, cost = budget - grown, max(cost, grown)
    log.info("openvino: %d of %d row counts compiled in %.1f s, %d MiB resident: %s; other calls run the dynamic-shape "
             "model", len(models), len(static_rows), time.perf_counter() - start,
             (resident_bytes() - resident) // 2**20, sorted(models))
    return models


@functools.lru_cache(maxsize=None)
def quantises_activations() -> bool:
    """Whether OpenVINO's CPU plugin quantises activations on the fly on this CPU when asked (DYNAMIC_GROUP): its
    dynamic quantisation needs int8 dot products (VNNI, AMX), and where they are missing it runs its float kernels,
    so the instruction set alone does not say. Asked of the plugin: the same rows through one int4 linear in NNCF's
    asymmetric grouped layout (the pattern the plugin compiles as a compressed FullyConnected), compiled with it on
    and off, differ where it does."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    rows, width, out, group = 4, 576, 1536, DYNAMIC_GROUP
    x = ops.parameter([-1, width], ov.Type.f32)
    codes, zero = (ops.constant(rng.integers(0, 16, shape).astype(np.uint8), dtype=ov.Type.u4)
                   for shape in ((out, width // group, group), (out, width // group, 1)))
    scale = ops.constant((rng.random((out, width // group, 1)) / 100).astype(np.float32))
    weight = ops.multiply(ops.subtract(ops.convert(codes, ov.Type.f32), ops.convert(zero, ov.Type.f32)), scale)
    weight = ops.reshape(weight, ops.constant(np.array([out, width], np.int64)), False)
    model = ov.Model([ops.matmul(x, weight, False, True)], [x])
    inputs = rng.standard_normal((rows, width)).astype(np.float32)
    first, second = (compiled(model, PROPERTIES | {"DYNAMIC_QUANTIZATION_GROUP_SIZE": g})(inputs)[0]
                     for g in (0, group))
    return not np.array_equal(first, second)


def available_bytes() -> int | None:
    """Memory the OS can give without swapping (Linux's MemAvailable; else free pages), None where unknown. Read by
    hand, as resident_bytes is: psutil does both, but it is no dependency of this project (installed here only
    through another package's requirements)."""
    return _memory("MemAvailable:", "SC_AVPHYS_PAGES")


def total_bytes() -> int | None:
    """The machine's memory (Linux's MemTotal; else its physical pages), None where unknown."""
    return _memory("MemTotal:", "SC_PHYS_PAGES")


def _memory(field: str, pages: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
    return None


def resident_bytes() -> int:
    """The process's resident memory now (Linux's /proc/self/statm), else its peak (getrusage: kilobytes on Linux,
    bytes on macOS), which a compile moves only when it grows past it."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reshaped(xml: str, rows: int, capacity: int = -1):
    """The IR at `xml` for batch 1 and `rows` new rows (every row's logits) on a cache of `capacity` slots (-1: its
    context dynamic)."""
    import openvino as ov

    model = ov.Core().read_model(xml)
    past, hidden = (model.input(name).get_partial_shape() for name in ("past", "inputs_embeds"))
    row_invariant = any(RECENT_INPUTS[0] in port.get_names() for port in model.inputs)
    keys = capacity + rows if capacity >= 0 else -1
    shapes = {"inputs_embeds": [1, rows, hidden[2].get_length()], "attention_mask": [1, 1, rows, keys],
              "position_ids": [1, rows], "past": [past[0].get_length(), 1, past[2].get_length(), capacity,
                                                  past[4].get_length()], "logits_rows": [rows], "hidden_rows": [-1]}
    model.reshape(shapes | ({name: [rows, RECENT_WINDOW] for name in RECENT_INPUTS} if row_invariant else {}))
    return model
