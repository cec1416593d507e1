"""The measured profile of the machine at hand: peaks per dtype and L(n, context) of the target per execution:
a backend (execution/backends.py), the activations' dtype and the weights' format (fp, int8, int4_g<group>:
execution/quantize.py).

Measured once per machine fingerprint (machine.py), model and version of the code that runs and times the forwards
(`code_digest`), cached as JSON under the specbench cache, and read
by hw=cpu / hw=cuda (their `measured` figures) and by the evaluator (the dtype choice, L(n) for tree budgets).
The cache decides every later run's dtype and backend, so it is written atomically and checked when read: a file cut
short, missing a key or holding an impossible number is measured again, with a one-line notice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from filelock import FileLock, Timeout
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.files import write_atomic
from specbench.hardware.measured import profiler
from specbench.hardware.measured.machine import fingerprint, machine_info
from specbench.hardware.measured.profiler import latency_profile
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.execution import attention, backends, linears, openvino, quantize
from specbench.execution.attention import attention_tag
from specbench.execution.backends import BACKENDS, OPENVINO, supported, with_backend
from specbench.execution.value import Execution
from specbench.models.loading import LoadedModel, cache_dir, cache_root, torch_dtype, with_dtype
from specbench.execution.quantize import Int4Linear, Int8Linear, W8A8Linear, with_weights
from specbench.execution.quantize import supported as weights_supported
from specbench.models.shape import ModelShape

SIZES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (128, 256, 1024)


def default_dtypes(device: torch.device | str) -> tuple[str, ...]:
    """The dtypes worth profiling: float16 has fast kernels on CUDA only."""
    return ("float32", "bfloat16", "float16") if torch.device(device).type == "cuda" else ("float32", "bfloat16")


def profile_dir() -> Path:
    return cache_root() / "profiles"


def _best_seconds(fn, sync, budget_s: float = 0.5, min_runs: int = 3) -> float:
    """The fastest of repeated runs within a time budget (after one warm-up): peak, not typical, speed."""
    fn()
    sync()
    best, start, runs = float("inf"), time.perf_counter(), 0
    while runs < min_runs or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        sync()
        best, runs = min(best, time.perf_counter() - t0), runs + 1
    return best


@torch.inference_mode()
def measure_peaks(device: torch.device | str, dtypes=None, matmul_size: int | None = None, read_mb: int = 256,
                  budget_s: float = 0.5) -> dict:
    """Matmul TFLOP/s per dtype, memory-read GB/s, the fixed cost per transformer layer and DRAM capacity.

    A few seconds: square linears (1024 on CPU, 8192 on CUDA) and 64-row ones (the faster counts), a sum over a 256 MB
    tensor, and the forward time
    of two tiny Llamas (2 and 8 layers) whose difference per layer is the dispatch cost no roofline sees."""
    from specbench.models.tiny import tiny_random

    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    size = matmul_size or (8192 if device.type == "cuda" else 1024)
    tflops = {}
    for name in dtypes or default_dtypes(device):
        a = torch.randn(size, size, device=device).to(torch_dtype(name))
        rows = a[:64].contiguous()  # a 64-token tree's shape
        linear = torch.nn.functional.linear  # the op a model runs: without native bf16 it is 15x faster than a @ b
        tflops[name] = max(2 * size**3 / _best_seconds(lambda: linear(a, a), sync, budget_s),
                           2 * 64 * size**2 / _best_seconds(lambda: linear(rows, a), sync, budget_s)) / 1e12
    if weights_supported("int8", device) is None:  # the weight-only kernels' own FLOP/s: they dequantise in registers
        tflops |= _quantised_peaks(size, device, sync, budget_s)
    x = torch.ones(read_mb * 2**18, device=device)  # read_mb of float32
    bandwidth = x.numel() * 4 / _best_seconds(x.sum, sync, budget_s) / 1e9
    per_forward = {layers: _one_token_forward_s(tiny_random(num_layers=layers, device=str(device)).model, sync,
                                                budget_s) for layers in (2, 8)}
    memory = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"peak_tflops": tflops, "mem_bandwidth_gbs": bandwidth,
            "layer_overhead_ms": max(0.0, 1e3 * (per_forward[8] - per_forward[2]) / 6), "memory_gb": memory / 1e9}


def _quantised_peaks(size: int, device: torch.device, sync, budget_s: float) -> dict:
    """TFLOP/s of a 64-row product with int8, int4 and w8a8 weights, in bfloat16 activations (the dtype their kernels
    vectorise: float32 activations ran 5-25x slower on an AVX-512 Zen 4, which task=profile's table shows)."""
    linear = torch.nn.Linear(size, size, bias=False, device=device)
    rows = torch.randn(64, size, device=device, dtype=torch.bfloat16)
    peaks = {}
    layers = {"int8": Int8Linear(linear), "int4": Int4Linear(linear, 32), "w8a8": W8A8Linear(linear)}
    for name, layer in layers.items():
        layer = layer.to(torch.bfloat16)
        peaks[name] = 2 * 64 * size**2 / _best_seconds(lambda: layer(rows), sync, budget_s) / 1e12  # noqa: B023
    return peaks


def _one_token_forward_s(model, sync, budget_s: float) -> float:
    """Fastest forward of one token over a 16-token cache."""
    cache = DynamicCache()
    ids = torch.zeros(1, 17, dtype=torch.long, device=model.device)
    model(input_ids=ids[:, :16], past_key_values=cache, use_cache=True)

    def step():
        model(input_ids=ids[:, 16:], past_key_values=cache, use_cache=True)
        cache.crop(-1)
    return _best_seconds(step, sync, budget_s)


def measured_peaks(device: torch.device | str) -> dict:
    """This machine's peaks from its newest valid cached profile (of any model), else measured now and cached."""
    device = torch.device(device)
    root, fp = profile_dir(), fingerprint()

    def cached(skip=()) -> dict | None:
        # peaks are the machine's, whatever code measured a profile: any code digest (profile_path) will do
        for path in sorted(root.glob(f"{fp}-*{device.type}-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
            peaks = None if (path, stamp(path)) in skip else _read_cached(path, _peaks_of)
            if peaks is not None:
                return peaks
        return None

    seen = {(path, stamp(path)) for path in root.glob(f"{fp}-*{device.type}-*.json")}  # each read once
    peaks = cached()
    if peaks is not None:
        return peaks
    with measuring_alone("peaks"):
        peaks = cached(skip=seen)  # measured by the process this one waited for
        if peaks is None:
            peaks = measure_peaks(device)
            write_atomic(root / f"{fp}-{device.type}-peaks.json",
                         json.dumps({"machine": machine_info(), "peaks": peaks}))
    return peaks


_LOCKS: dict[Path, FileLock] = {}


@contextmanager
def measuring_alone(what: str):
    """Hold the cache's measuring lock (flock, through filelock) while this process measures: two first runs on a
    fresh cache would time each other's forwards and cache the contended numbers (L(1) 2.6x the quiet value seen). A
    second process waits here for the first, then finds what it cached. Checks the cache writable first, so a cache
    that cannot take the result is one line before minutes of measuring. Re-entrant within a process."""
    folder = cache_dir("profiles")
    lock = _LOCKS.setdefault(folder, FileLock(folder / ".measuring.lock", preserve_lock_file=True,
                                              fallback_to_soft=False))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        print(f"waiting for another process measuring this machine (it holds {lock.lock_file}) before measuring "
              f"{what}: measured side by side, both would be wrong", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _read_cached(path: Path, parse):
    """parse(the file's text), or None with a one-line notice naming the file and what is wrong with it."""
    try:
        return parse(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot be read ({exc})"
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc})"
    except SpecbenchError as exc:
        problem = str(exc).removeprefix("the machine profile ")
    print(f"notice: the cached machine profile {path} {problem}; measuring it again")
    return None


def _peaks_of(text: str) -> dict:
    data = json.loads(text)
    if not isinstance(data, dict) or "peaks" not in data:
        raise SpecbenchError("the machine profile lacks the key 'peaks'")
    return _checked_peaks(data["peaks"])


def _positive(value, zero_ok: bool = False) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value >= 0 if zero_ok else value > 0))


def _checked_peaks(peaks) -> dict:
    """peaks as measure_peaks returns them, or SpecbenchError naming the first missing or impossible figure."""
    if not isinstance(peaks, dict):
        raise SpecbenchError(f"the machine profile holds peaks={peaks!r}, not a mapping")
    for key in ("peak_tflops", "mem_bandwidth_gbs", "layer_overhead_ms", "memory_gb"):
        if key not in peaks:
            raise SpecbenchError(f"the machine profile lacks the key 'peaks.{key}'")
    tflops = peaks["peak_tflops"]
    if not isinstance(tflops, dict) or not tflops or not all(_positive(v) for v in tflops.values()):
        raise SpecbenchError(f"the machine profile holds peaks.peak_tflops={tflops!r}: it must map dtypes to finite "
                             f"positive TFLOP/s")
    for key in ("mem_bandwidth_gbs", "layer_overhead_ms", "memory_gb"):
        if not _positive(peaks[key], zero_ok=key == "layer_overhead_ms"):
            raise SpecbenchError(f"the machine profile holds peaks.{key}={peaks[key]!r}: it must be a finite "
                                 + ("number >= 0" if key == "layer_overhead_ms" else "positive number"))
    return peaks


@dataclass
class MachineProfile:
    """Peaks and the measured L(n, context) per backend and dtype of one model on one machine."""

    machine: dict
    device: str
    model: str
    peaks: dict  # peak_tflops {dtype: TFLOP/s}, mem_bandwidth_gbs, layer_overhead_ms, memory_gb
    latency: pd.DataFrame  # backend, dtype, weights, context, tokens, ms
    compile_seconds: dict = dataclasses.field(default_factory=dict)  # execution label: first-forwards' compile time
    _grids: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Refuses (SpecbenchError) a latency table that latency_ms could not read: a missing column, a latency,
        size or context that is not a finite positive number, a backend/dtype without every (size, context) pair."""
        if "backend" not in self.latency:  # profiles cached before backends existed measured transformers' eager
            self.latency.insert(0, "backend", "eager")
        if "weights" not in self.latency:  # ... and before quantised targets, the weights as loaded
            self.latency.insert(self.latency.columns.get_loc("dtype") + 1 if "dtype" in self.latency else 1,
                                "weights", "fp")
        missing = [c for c in ("dtype", "context", "tokens", "ms") if c not in self.latency]
        if self.latency.empty or missing:
            raise SpecbenchError("the machine profile " + (f"has no latency column {missing[0]!r}"
                                                           if len(self.latency) else "has no latencies"))
        numbers = self.latency[["tokens", "context", "ms"]].apply(pd.to_numeric, errors="coerce")
        bad = ~np.isfinite(numbers.to_numpy(float)) | (numbers.to_numpy(float) <= 0)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            r = self.latency.iloc[row]
            name = numbers.columns[col]
            value = r[name].item() if isinstance(r[name], np.generic) else r[name]  # repr 'nan', not 'np.float64(nan)'
            raise SpecbenchError(f"the machine profile holds {name}={value!r} "
                                 f"({Execution(r['backend'], r['dtype'], r['weights']).label}, "
                                 f"n={r['tokens']}, context {r['context']}): latencies, sizes and contexts must be "
                                 f"finite positive numbers")
        self.latency[["tokens", "context", "ms"]] = numbers
        for execution, rows in self.latency.groupby(["backend", "dtype", "weights"], sort=False):
            if len(set(zip(rows["tokens"], rows["context"]))) != rows["tokens"].nunique() * rows["context"].nunique():
                raise SpecbenchError(f"the machine profile lacks some (n, context) pairs of "
                                     f"{Execution(*execution).label}: each execution needs every measured size at "
                                     f"every measured context")

    @property
    def dtypes(self) -> list[str]:
        return list(dict.fromkeys(self.latency["dtype"]))

    @property
    def executions(self) -> list[Execution]:
        """The executions measured, in measuring order."""
        return [Execution(*e) for e in
                dict.fromkeys(zip(self.latency["backend"], self.latency["dtype"], self.latency["weights"]))]

    def only(self, backends=None, dtypes=None, weights=None) -> MachineProfile:
        """This profile restricted to the executions of these backends, dtypes and weights (None: any). A cached
        profile also holds what other runs measured, such as a backend this environment has not installed: a run
        chooses among what it asked for."""
        keep = pd.Series(True, index=self.latency.index)
        for column, values in (("backend", backends), ("dtype", dtypes), ("weights", weights)):
            if values is not None:
                keep &= self.latency[column].isin(list(values))
        return dataclasses.replace(self, latency=self.latency[keep].reset_index(drop=True))

    def latency_ms(self, dtype: str, n: float, context: float, backend: str = "eager", weights: str = "fp") -> float:
        """L(n, context) in ms: bilinear between measured points, the smallest measured value below the range, and
        linear above it with slopes >= 0. Measurement noise can make a bigger tree or a longer context read cheaper;
        the table is first made non-decreasing along both, so the result is positive and monotone in n and context
        (a tree of n + 1 never costs less than one of n), as choosing a dtype, a backend or a budget assumes."""
        sizes, contexts, ms, n_slope, c_slope = self._grid(dtype, backend, weights)
        n_in, c_in = np.clip(n, sizes[0], sizes[-1]), np.clip(context, contexts[0], contexts[-1])
        at = [np.interp(n_in, sizes, ms[:, k]) for k in range(len(contexts))]
        return float(np.interp(c_in, contexts, at) + max(0.0, n - sizes[-1]) * np.interp(c_in, contexts, n_slope)
                     + max(0.0, context - contexts[-1]) * np.interp(n_in, sizes, c_slope))

    def _grid(self, dtype: str, backend: str, weights: str) -> tuple[np.ndarray, ...]:
        """(sizes, contexts, ms[size, context] made non-decreasing along both axes, the slope in n beyond the largest
        size per context, the slope in context beyond the largest context per size): slopes >= 0 and non-decreasing
        along the other axis, so the extrapolation keeps the monotonicity the table has."""
        if (backend, dtype, weights) not in self._grids:
            rows = self.latency[(self.latency["dtype"] == dtype) & (self.latency["backend"] == backend)
                                & (self.latency["weights"] == weights)]
            if rows.empty:
                have = ", ".join(e.label for e in self.executions)
                raise SpecbenchError(f"the machine profile has no execution '{Execution(backend, dtype, weights).label}'"
                                     f"; it has: {have}")
            table = rows.pivot_table(index="tokens", columns="context", values="ms", aggfunc="min")
            ms = np.maximum.accumulate(np.maximum.accumulate(table.to_numpy(float), axis=0), axis=1)
            sizes, contexts = table.index.to_numpy(float), table.columns.to_numpy(float)
            self._grids[backend, dtype, weights] = (sizes, contexts, ms, _end_slope(sizes, ms),
                                                    _end_slope(contexts, ms.T))
        return self._grids[backend, dtype, weights]

    def curve(self, dtype: str, context: float, backend: str = "eager", weights: str = "fp") -> pd.DataFrame:
        """L(n) at one context over the measured sizes, as the tokens/ms frame latency_profile returns."""
        sizes = sorted(set(self.latency["tokens"]))
        return pd.DataFrame({"tokens": sizes,
                             "ms": [self.latency_ms(dtype, n, context, backend, weights) for n in sizes]})

    def covers(self, dtypes, sizes, contexts, backends=("eager",), weights=("fp",)) -> bool:
        have = set(zip(self.latency["backend"], self.latency["dtype"], self.latency["weights"],
                       self.latency["context"], self.latency["tokens"]))
        skipped = set(self.machine.get("unsupported", {}))  # executions this machine cannot run
        return all((b, d, w, c, n) in have or Execution(b, d, w).label in skipped
                   for b in backends for d in dtypes for w in weights for c in contexts for n in sizes)

    def to_json(self) -> str:
        return json.dumps({"machine": self.machine, "device": self.device, "model": self.model, "peaks": self.peaks,
                           "latency": self.latency.to_dict(orient="records"),
                           "compile_seconds": self.compile_seconds}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> MachineProfile:
        """The profile to_json wrote; json.JSONDecodeError or SpecbenchError (what is missing or impossible)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise SpecbenchError("the machine profile is not a JSON object")
        for key in ("machine", "device", "model", "peaks", "latency"):
            if key not in data:
                raise SpecbenchError(f"the machine profile lacks the key '{key}'")
        if not isinstance(data["machine"], dict):
            raise SpecbenchError("the machine profile holds a 'machine' that is not a mapping")
        if not isinstance(data["latency"], list) or not all(isinstance(r, dict) for r in data["latency"]):
            raise SpecbenchError("the machine profile holds a 'latency' that is not a list of records")
        return cls(data["machine"], data["device"], data["model"], _checked_peaks(data["peaks"]),
                   pd.DataFrame(data["latency"]), data.get("compile_seconds", {}))


def _end_slope(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """d ys / d xs over the last segment along axis 0 (0 for a single point), one per column, made non-decreasing
    from column to column."""
    if len(xs) == 1:
        return np.zeros(ys.shape[1])
    return np.maximum.accumulate((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))


# The modules whose code decides what a profiled forward costs: a profile cached by another version of them (say,
# a compiled backend before its weights were frozen) would steer every later run by numbers this code no longer gives.
MEASURED_BY = (backends, quantize, linears, attention, openvino, profiler)


def code_digest(files=None) -> str:
    """Short hash of the source of `files` (default: the modules of MEASURED_BY), part of a cached measurement's
    name (the profile here, the attention windows in attention.py)."""
    paths = files if files is not None else [path for m in MEASURED_BY for path in _sources(m)]
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:10]


def _sources(module) -> list[Path]:
    """A module's source file, or every source file of a package (its code spreads over them)."""
    path = Path(module.__file__)
    return sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]


def profile_path(model_name: str, device: torch.device | str) -> Path:
    return profile_dir() / f"{fingerprint()}-{code_digest()}-{torch.device(device).type}-{model_name}.json"


def load_or_measure_profile(target: LoadedModel, dtypes=None, sizes=SIZES, contexts=CONTEXTS,
                            repeats: int = 3, backends=("eager",), weights=("fp",)) -> MachineProfile:
    """The cached profile of `target` on this machine, measured now (peaks too; cached) when it lacks a requested
    point. Each point is the fastest of `repeats` forwards, and the load average before and after is kept, so a
    profile taken on a busy machine can be told apart. Each execution is timed on a copy of the target quantised to
    its weights' format (fp, int8, int4_g<group>) and cast to its dtype: a forward's cost depends on those, not on
    the weights' values. An execution this machine cannot run (oneDNN packing bf16 without AVX-512, prepacked over
    quantised layers) is recorded as unsupported, with the reason, rather than measured; so is a quantised one that a
    probe finds DOMINATED (_dominated)."""
    device = target.model.device
    dtypes, sizes, contexts = list(dtypes or default_dtypes(device)), list(sizes), list(contexts)
    backends, weights = list(backends or BACKENDS), list(weights)
    tag = attention_tag(target)  # the attention kernel changes L(n, context): a profile is measured under one
    path = profile_path(target.name if tag == "sdpa" else f"{target.name}-attention_{tag}", device)
    seen = stamp(path)
    cached = _read_cached(path, MachineProfile.from_json) if seen else None
    if cached is not None and cached.covers(dtypes, sizes, contexts, backends, weights):
        return cached
    with measuring_alone(f"the profile of {target.name}"):
        if stamp(path) != seen:  # written by the process this one waited for
            cached = _read_cached(path, MachineProfile.from_json)
            if cached is not None and cached.covers(dtypes, sizes, contexts, backends, weights):
                return cached
        return _measure_profile(target, path, dtypes, sizes, contexts, repeats, backends, weights, cached)


def stamp(path: Path) -> tuple[int, int] | None:
    """(mtime, size) of a cache file, None when there is none: whether another process wrote it meanwhile."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _measure_profile(target: LoadedModel, path: Path, dtypes, sizes, contexts, repeats, backends, weights,
                     cached: MachineProfile | None = None) -> MachineProfile:
    """Measure the executions `cached` lacks (every requested one when there is none) and keep the ones it has: a
    run that asks for one more execution, or a task=profile after a first run, measures only what is new."""
    device = target.model.device
    frames = [cached.latency] if cached is not None else []
    unsupported = dict(cached.machine.get("unsupported", {})) if cached is not None else {}
    compile_s = dict(cached.compile_seconds or {}) if cached is not None else {}
    todo = [(fmt, name, backend) for fmt in weights for name in dtypes for backend in backends
            if cached is None or not cached.covers([name], sizes, contexts, [backend], [fmt])]
    if cached is not None:  # what is measured anew spans the cached grid too, so each execution's grid stays whole
        sizes = sorted({*sizes, *cached.latency["tokens"].astype(int)})
        contexts = sorted({*contexts, *cached.latency["context"].astype(int)})
    kept = len(cached.executions) if cached is not None else 0
    print(f"measuring this machine's profile of {target.name} once ({len(todo)} execution(s): "
          f"{', '.join(Execution(b, d, w).label for w, d, b in todo)}; minutes{f'; {kept} cached' if kept else ''}), "
          f"L(n) for n up to {max(sizes)} at contexts {', '.join(map(str, sorted(contexts)))} (more sizes and "
          f"contexts are measured when a run needs them, or by task=profile), cached at {path}")
    load_before = os.getloadavg()[0]
    peaks = cached.peaks if cached is not None else measure_peaks(device)
    for fmt in dict.fromkeys(w for w, _, _ in todo):
        reason = weights_supported(fmt, device)
        quantised = target if reason else with_weights(target, fmt)
        for name in dict.fromkeys(d for w, d, _ in todo if w == fmt):
            cast = None if reason else with_dtype(quantised, name)
            for backend in [b for w, d, b in todo if (w, d) == (fmt, name)]:
                label = Execution(backend, name, fmt).label
                unsupported.pop(label, None)
                why = ((reason if backend != OPENVINO else None)  # openvino compresses them itself: its own say
                       or supported(backend, torch_dtype(name), device) or weights_supported(fmt, device, backend))
                if why:
                    unsupported[label] = why
                    print(f"  {label}: not measured: {why}")
                    continue
                # openvino compresses the float weights itself (Execution.apply hands it them)
                run = Execution(backend, name, fmt).apply(target) if backend == OPENVINO else with_backend(cast, backend)
                why = _dominated(run.model, fmt, frames, sizes, contexts[0])
                if why:
                    unsupported[label] = why
                    print(f"  {label}: not measured: {why}")
                    continue
                frame = latency_profile(run.model, sizes, contexts, repeats, statistic="min")
                frames.append(frame.assign(backend=backend, dtype=name, weights=fmt))
                stats = getattr(run.model, "compile_stats", None)
                if stats is not None:
                    compile_s[label] = stats.seconds
                print(f"  {label}: L(1) {frame['ms'].iloc[0]:.1f} ms, L({sizes[-1]}) "
                      f"{frame['ms'].iloc[len(sizes) - 1]:.1f} ms at context {contexts[0]}"
                      + (f"; compiled in {stats.seconds:.0f} s" if stats else ""))
                del run
            del cast
        del quantised
    machine = {**machine_info(), "loadavg_1min": [load_before, os.getloadavg()[0]], "cpus": os.cpu_count(),
               "unsupported": unsupported}
    columns = ["backend", "dtype", "weights", "context", "tokens", "ms"]
    latency = pd.concat(frames, ignore_index=True)[columns].drop_duplicates(  # a point measured anew replaces its old
        ["backend", "dtype", "weights", "context", "tokens"], keep="last").reset_index(drop=True)
    profile = MachineProfile(machine, device.type, target.name, peaks, latency, compile_s)
    if busy(machine):  # a profile taken beside other work would mislead every later run on this machine
        print(f"warning: the machine was busy while profiling (1-min load {max(machine['loadavg_1min']):.1f} on "
              f"{machine['cpus']} CPUs): this run uses the profile, but it is not cached; profile on a quiet machine")
        return profile
    write_atomic(path, profile.to_json())
    return profile


DOMINATED = 2.0  # an execution this many times slower than a measured one at both ends is not measured


def _dominated(model, weights: str, frames: list[pd.DataFrame], sizes: list[int], context: int) -> str | None:
    """Why an execution need not be measured: one forward at the smallest and the largest size, both at least
    DOMINATED x the fastest execution measured so far (quantised kernels that do not vectorise an activation dtype, as
    int4 with fp32 activations on a CPU, or oneDNN's bf16 packing on a CPU without native bf16, take minutes to
    profile and can win nothing). A float execution is compared with float ones only, so the float weights' fastest
    plain decoding, the headline's reference, is always measured."""
    measured = pd.concat(frames) if frames else None
    if measured is not None and weights == "fp":
        measured = measured[measured["weights"] == "fp"]
    if measured is None or measured.empty:
        return None
    ends = [sizes[0], sizes[-1]] if len(sizes) > 1 else sizes
    probe = latency_profile(model, ends, [context], repeats=1, statistic="min").set_index("tokens")["ms"]
    best = measured[measured["context"] == context].groupby("tokens")["ms"].min()
    if all(n in best.index and probe[n] >= DOMINATED * best[n] for n in ends):
        return ("dominated: " + ", ".join(f"L({n}) {probe[n]:.0f} ms" for n in ends) + f" at context {context}, at "
                f"least {DOMINATED:g}x the fastest measured (" + ", ".join(f"{best[n]:.0f}" for n in ends) + " ms)")
    return None


def busy(machine: dict) -> bool:
    """More runnable threads than cores besides this process's own (about one per core it uses)."""
    return max(machine.get("loadavg_1min", [0.0])) > machine.get("cpus", 1) + 1


def choose_execution(profile: MachineProfile, tree_size: float, context: float, backends=None, dtypes=None,
                     weights=None, plain: Execution | None = None) -> tuple[Execution, str]:
    """(execution, reason): the measured execution with the cheapest verify forward L(tree_size) among
    the allowed ones, and a one-line reason naming the fastest plain decoding L(1) on the machine (`plain`, default
    fastest_plain's): a method must beat that, whatever its backend, dtype and weights."""
    allowed = [e for e in profile.executions
               if (backends is None or e.backend in backends) and (dtypes is None or e.dtype in dtypes)
               and (weights is None or e.weights in weights)]
    if not allowed:
        have = ", ".join(e.label for e in profile.executions)
        raise SpecbenchError(f"the machine profile has no measurement for backend {backends}, dtype {dtypes} and "
                             f"weights {weights}; it has: {have}")
    verify = {e: profile.latency_ms(e.dtype, tree_size, context, e.backend, e.weights) for e in allowed}
    best = min(verify, key=verify.get)
    plain = plain or fastest_plain(profile, context)
    others = ", ".join(f"{e.label} {ms:.1f} ms" for e, ms in verify.items() if e != best)
    reason = (f"{best.label}: L({tree_size:g}) at context {context:g} is {verify[best]:.1f} ms"
              + (f" (vs {others})" if others else "") + f"; fastest plain decoding is {plain.label} at "
              f"L(1) = {profile.latency_ms(plain.dtype, 1, context, plain.backend, plain.weights):.1f} ms")
    return best, reason


def fastest_plain(profile: MachineProfile, context: float, weights=None) -> Execution:
    """The execution of the cheapest one-token forward among the measured ones (with weights in
    `weights`, None: any): the plain decoding every speedup is judged against, a quantised target's included: it
    is the fastest plain decoding this machine offers."""
    allowed = [e for e in profile.executions if weights is None or e.weights in weights] \
        or profile.executions  # none of `weights` could run here (unsupported): any measured one
    return min(allowed, key=lambda e: profile.latency_ms(e.dtype, 1, context, e.backend, e.weights))


def as_spec(profile: MachineProfile, base: HardwareSpec) -> HardwareSpec:
    """`base` with this profile's measured figures: the roofline of the machine the profile was taken on."""
    peaks = profile.peaks
    return dataclasses.replace(base, name=f"{profile.device} (measured)", device=profile.device,
                               peak_tflops=peaks["peak_tflops"], mem_bandwidth_gbs=peaks["mem_bandwidth_gbs"],
                               layer_overhead_ms=peaks["layer_overhead_ms"], memory_gb=peaks["memory_gb"],
                               weight_dtype=None, units=[], partition="gpu_only")


def roofline_error(profile: MachineProfile, shape: ModelShape, hw: HardwareSpec) -> pd.DataFrame:
    """Measured L(n, context) beside the roofline's, per dtype, with the relative error; bound_ms is the same roofline
    without the per-layer fixed cost (the dispatch a tiny model measures): the hardware's own bound, which a faster
    backend can approach and the full roofline already concedes."""
    frame = profile.latency.copy()  # the roofline depends on the dtype and weights only: what every backend aims at
    frame["roofline_dtype"] = frame["weights"].where(frame["weights"] != "fp", frame["dtype"])  # int8: 1 B/param
    points = list(zip(frame["roofline_dtype"], frame["context"], frame["tokens"]))
    frame["roofline_ms"] = [1e3 * roofline_step_time(shape, hw, n, c, dtype=d) for d, c, n in points]
    bare = dataclasses.replace(hw, layer_overhead_ms=0.0)
    frame["bound_ms"] = [1e3 * roofline_step_time(shape, bare, n, c, dtype=d) for d, c, n in points]
    frame["error_pct"] = 100 * (frame["roofline_ms"] - frame["ms"]) / frame["ms"]
    return frame
