"""The measured profile of one model on the machine at hand: L(n, context) of the target per execution (a backend
(execution/backends.py), the activations' dtype and the weights' format (execution/quantize.py)), and whether each
execution's verify rows are its plain decoding's (row_invariance.py).

Measured once per machine fingerprint (machine.py), model and measuring key (cache.py), cached as JSON under the
specbench cache, and read by the evaluator (the execution choice, L(n) for tree budgets). The cache decides every later
run's execution, so it is written atomically and checked when read: a file cut short, missing a key or holding an
impossible number is measured again, with a one-line notice. An execution a run found slower than the profile said is
marked stale there and measured again by the next run (`mark_stale`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specbench.errors import SpecbenchError
from specbench.files import write_atomic
from specbench.hardware.measured.cache import measuring_alone, measuring_key, profile_dir, read_cached, stamp
from specbench.hardware.measured.machine import fingerprint, machine_info
from specbench.hardware.measured.peaks import checked_peaks, default_dtypes, measure_peaks
from specbench.hardware.measured.profiler import latency_profile
from specbench.hardware.measured.row_invariance import RowInvariance, check_rows
from specbench.execution.attention import attention_tag
from specbench.execution.backends import BACKENDS, OWN_GRAPH, supported, with_backend
from specbench.execution.value import Execution
from specbench.models.loading import LoadedModel, torch_dtype, with_dtype
from specbench.execution.quantize import with_weights
from specbench.execution.quantize import supported as weights_supported

SIZES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (128, 256, 1024)


@dataclass
class MachineProfile:
    """Peaks and the measured L(n, context) per backend and dtype of one model on one machine."""

    machine: dict
    device: str
    model: str
    peaks: dict  # peak_tflops {dtype: TFLOP/s}, mem_bandwidth_gbs, layer_overhead_ms, memory_gb
    latency: pd.DataFrame  # backend, dtype, weights, context, tokens, ms
    compile_seconds: dict = dataclasses.field(default_factory=dict)  # execution label: first-forwards' compile time
    rows: dict = dataclasses.field(default_factory=dict)  # execution label: its RowInvariance (row_invariance.py)
    stale: list = dataclasses.field(default_factory=list)  # labels a run found slower than measured: measured again
    path: Path | None = dataclasses.field(default=None, compare=False)  # the cache file it was read from or written to
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
        """Every requested execution measured at every requested point, its rows checked, none of it stale (or the
        machine cannot run it)."""
        skipped = set(self.machine.get("unsupported", {}))  # executions this machine cannot run
        return all(e.label in skipped or (self.timed(e, sizes, contexts) and e.label in self.rows)
                   for e in (Execution(b, d, w) for b in backends for d in dtypes for w in weights))

    def timed(self, execution: Execution, sizes, contexts) -> bool:
        """L(n, context) of `execution` measured at every requested point and not stale."""
        if execution.label in self.stale:
            return False
        have = set(zip(self.latency["backend"], self.latency["dtype"], self.latency["weights"],
                       self.latency["context"], self.latency["tokens"]))
        return all((*execution, c, n) in have for c in contexts for n in sizes)

    def lossless(self, execution: Execution) -> bool:
        """Whether a verify on `execution` keeps its plain decoding's tokens here, as its row check found (up to float
        near-ties where rows differ by rounding); True where it was not checked (a profile made in code)."""
        check = self.rows.get(execution.label)
        return check is None or check.lossless

    def to_json(self) -> str:
        return json.dumps({"machine": self.machine, "device": self.device, "model": self.model, "peaks": self.peaks,
                           "latency": self.latency.to_dict(orient="records"),
                           "compile_seconds": self.compile_seconds,
                           "rows": {label: r.as_dict() for label, r in self.rows.items()}, "stale": self.stale},
                          indent=1)

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
        return cls(data["machine"], data["device"], data["model"], checked_peaks(data["peaks"]),
                   pd.DataFrame(data["latency"]), data.get("compile_seconds", {}), _rows_of(data.get("rows", {})),
                   list(data.get("stale", [])))


def _rows_of(data) -> dict[str, RowInvariance]:
    """The cached row checks, or SpecbenchError naming what is wrong with them."""
    try:
        return {str(label): RowInvariance.from_dict(r) for label, r in data.items()}
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise SpecbenchError(f"the machine profile holds rows={data!r}, not row checks ({exc})") from exc


def _end_slope(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """d ys / d xs over the last segment along axis 0 (0 for a single point), one per column, made non-decreasing
    from column to column."""
    if len(xs) == 1:
        return np.zeros(ys.shape[1])
    return np.maximum.accumulate((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))


# The modules whose code decides what a profiled forward costs: a profile cached by another version of them (say,
# a compiled backend before its weights were frozen) would steer every later run by numbers this code no longer gives.

def profile_path(model_name: str, device: torch.device | str) -> Path:
    return profile_dir() / f"{fingerprint()}-{measuring_key()}-{torch.device(device).type}-{model_name}.json"


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
    path = _path_of(target)
    seen = stamp(path)
    cached = _read_profile(path) if seen else None
    if cached is not None and cached.covers(dtypes, sizes, contexts, backends, weights):
        return cached
    with measuring_alone(f"the profile of {target.name}"):
        if stamp(path) != seen:  # written by the process this one waited for
            cached = _read_profile(path)
            if cached is not None and cached.covers(dtypes, sizes, contexts, backends, weights):
                return cached
        return _measure_profile(target, path, dtypes, sizes, contexts, repeats, backends, weights, cached)


def _read_profile(path: Path) -> MachineProfile | None:
    profile = read_cached(path, MachineProfile.from_json)
    if profile is not None:
        profile.path = path
    return profile


def _path_of(target: LoadedModel) -> Path:
    tag = attention_tag(target)  # the attention kernel changes L(n, context): a profile is measured under one
    return profile_path(target.name if tag == "sdpa" else f"{target.name}-attention_{tag}", target.model.device)


def mark_stale(profile: MachineProfile, labels: list[str]) -> None:
    """Mark executions stale in the cached file `profile` came from, so the next run measures them again: a run timed
    their plain decoding in another order than the profile ranked them."""
    if profile.path is None:
        return
    with measuring_alone(f"the profile of {profile.model}"):
        cached = _read_profile(profile.path) if stamp(profile.path) else None
        if cached is not None:
            cached.stale = sorted({*cached.stale, *labels})
            write_atomic(profile.path, cached.to_json())


def _measure_profile(target: LoadedModel, path: Path, dtypes, sizes, contexts, repeats, backends, weights,
                     cached: MachineProfile | None = None) -> MachineProfile:
    """Measure the executions `cached` lacks (every requested one when there is none) and keep the ones it has: a
    run that asks for one more execution, or a task=profile after a first run, measures only what is new."""
    device = target.model.device
    frames = [cached.latency] if cached is not None else []
    unsupported = dict(cached.machine.get("unsupported", {})) if cached is not None else {}
    compile_s = dict(cached.compile_seconds or {}) if cached is not None else {}
    rows = dict(cached.rows) if cached is not None else {}
    todo = [(fmt, name, backend) for fmt in weights for name in dtypes for backend in backends
            if cached is None or not cached.covers([name], sizes, contexts, [backend], [fmt])]
    to_time = {Execution(b, d, w) for w, d, b in todo if cached is None or not cached.timed(Execution(b, d, w), sizes,
                                                                                         contexts)}
    if cached is not None:  # an execution timed anew (stale, or missing points) is not compared with its old numbers
        old = pd.Series([Execution(*e) in to_time for e in zip(cached.latency["backend"], cached.latency["dtype"],
                                                                cached.latency["weights"])], index=cached.latency.index)
        frames = [cached.latency[~old]]
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
                why = ((reason if backend not in OWN_GRAPH else None)  # these quantise them themselves: their say
                       or supported(backend, torch_dtype(name), device, target.model.config)
                       or weights_supported(fmt, device, backend))
                if why:
                    unsupported[label] = why
                    print(f"  {label}: not measured: {why}")
                    continue
                # openvino and onnxruntime quantise the float weights themselves (Execution.apply hands them them)
                run = Execution(backend, name, fmt).apply(target) if backend in OWN_GRAPH else with_backend(cast, backend)
                if Execution(backend, name, fmt) in to_time:
                    why = _dominated(run.model, fmt, frames, sizes, contexts[0], dtypes)
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
                rows[label] = check_rows(run.model, torch_dtype(name), target.model.config.vocab_size)
                print(f"  {label}: {rows[label].describe()}: {rows[label].verdict}"
                      + ("" if rows[label].lossless else " (no lossless verify target here)"))
                del run
            del cast
        del quantised
    machine = {**machine_info(), "loadavg_1min": [load_before, os.getloadavg()[0]], "cpus": os.cpu_count(),
               "unsupported": unsupported}
    asked = {Execution(b, d, w).label for w in weights for d in dtypes for b in backends}
    if not asked & {Execution(*e).label for f in frames for e in zip(f["backend"], f["dtype"], f["weights"])}:
        refusals = {label: why for label, why in unsupported.items() if label in asked}
        by_reason = {why: [label for label, w in refusals.items() if w == why] for why in refusals.values()}
        refused = "; ".join(f"{', '.join(labels)}: {why}" for why, labels in by_reason.items())
        raise SpecbenchError(f"the machine profile of {target.name} has no execution this machine can run ({refused}); "
                             f"add one that can to eval.profile_backends (e.g. eager) or eval.profile_weights (fp)")
    columns = ["backend", "dtype", "weights", "context", "tokens", "ms"]
    latency = pd.concat(frames, ignore_index=True)[columns].drop_duplicates(  # a point measured anew replaces its old
        ["backend", "dtype", "weights", "context", "tokens"], keep="last").reset_index(drop=True)
    stale = [label for label in (cached.stale if cached is not None else [])
             if label not in {e.label for e in to_time}]
    profile = MachineProfile(machine, device.type, target.name, peaks, latency, compile_s, rows, stale, path)
    if busy(machine):  # a profile taken beside other work would mislead every later run on this machine
        print(f"warning: the machine was busy while profiling (1-min load {max(machine['loadavg_1min']):.1f} on "
              f"{machine['cpus']} CPUs): this run uses the profile, but it is not cached; profile on a quiet machine")
        return profile
    write_atomic(path, profile.to_json())
    return profile


DOMINATED = 2.0  # an execution this many times slower than a measured one at both ends is not measured
# the probe's forwards at each end, the fastest kept: a single forward beside other work (a test worker's neighbour,
# a busy machine) can take twice its time and drop an execution the run asked for
PROBE_REPEATS = 3


def _dominated(model, weights: str, frames: list[pd.DataFrame], sizes: list[int], context: int,
               dtypes: list[str]) -> str | None:
    """Why an execution need not be measured: one forward at the smallest and the largest size, both at least
    DOMINATED x the fastest execution of the dtypes asked for measured so far (quantised kernels that do not vectorise
    an activation dtype, as int4 with fp32 activations on a CPU, or oneDNN's bf16 packing on a CPU without native
    bf16, take minutes to profile and can win nothing). A float execution is compared with float ones only, so the
    float weights' fastest plain decoding, the headline's reference, is always measured; and a dtype asked for is
    never dominated by a cached one of another dtype (a GPU's bf16 profile does not stop a float32 one)."""
    measured = pd.concat(frames) if frames else None
    if measured is not None:
        measured = measured[measured["dtype"].isin(dtypes) & ((measured["weights"] == "fp") | (weights != "fp"))]
    if measured is None or measured.empty:
        return None
    ends = [sizes[0], sizes[-1]] if len(sizes) > 1 else sizes
    probe = latency_profile(model, ends, [context], repeats=PROBE_REPEATS, statistic="min").set_index("tokens")["ms"]
    best = measured[measured["context"] == context].groupby("tokens")["ms"].min()
    if all(n in best.index and probe[n] >= DOMINATED * best[n] for n in ends):
        return ("dominated: " + ", ".join(f"L({n}) {probe[n]:.0f} ms" for n in ends) + f" at context {context}, at "
                f"least {DOMINATED:g}x the fastest measured (" + ", ".join(f"{best[n]:.0f}" for n in ends) + " ms)")
    return None


def busy(machine: dict) -> bool:
    """More runnable threads than cores besides this process's own (about one per core it uses)."""
    return max(machine.get("loadavg_1min", [0.0])) > machine.get("cpus", 1) + 1
