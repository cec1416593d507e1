"""The measured profile of the machine at hand: peaks per dtype and L(n, context) of the target per execution
backend and dtype (an "execution": models/backends.py).

Measured once per machine fingerprint (machine.py) and model, cached as JSON under the specbench cache, and read
by hw=cpu / hw=cuda (their `measured` figures) and by the evaluator (the dtype choice, L(n) for tree budgets).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.hardware.machine import fingerprint, machine_info
from specbench.hardware.profiler import latency_profile
from specbench.hardware.roofline import ModelShape, roofline_step_time
from specbench.hardware.spec import HardwareSpec
from specbench.models.backends import BACKENDS, supported, with_backend
from specbench.models.loading import LoadedModel, cache_root, torch_dtype, with_dtype

SIZES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (128, 1024)


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
    x = torch.ones(read_mb * 2**18, device=device)  # read_mb of float32
    bandwidth = x.numel() * 4 / _best_seconds(x.sum, sync, budget_s) / 1e9
    per_forward = {layers: _one_token_forward_s(tiny_random(num_layers=layers, device=str(device)).model, sync,
                                                budget_s) for layers in (2, 8)}
    memory = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"peak_tflops": tflops, "mem_bandwidth_gbs": bandwidth,
            "layer_overhead_ms": max(0.0, 1e3 * (per_forward[8] - per_forward[2]) / 6), "memory_gb": memory / 1e9}


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
    """This machine's peaks from its newest cached profile (of any model), else measured now and cached."""
    device = torch.device(device)
    root, fp = profile_dir(), fingerprint()
    for path in sorted(root.glob(f"{fp}-{device.type}-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        return json.loads(path.read_text())["peaks"]
    peaks = measure_peaks(device)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{fp}-{device.type}-peaks.json").write_text(json.dumps({"machine": machine_info(), "peaks": peaks}))
    return peaks


@dataclass
class MachineProfile:
    """Peaks and the measured L(n, context) per backend and dtype of one model on one machine."""

    machine: dict
    device: str
    model: str
    peaks: dict  # peak_tflops {dtype: TFLOP/s}, mem_bandwidth_gbs, layer_overhead_ms, memory_gb
    latency: pd.DataFrame  # backend, dtype, context, tokens, ms
    compile_seconds: dict = dataclasses.field(default_factory=dict)  # "backend/dtype": first-forwards' compile time

    def __post_init__(self) -> None:
        if "backend" not in self.latency:  # profiles cached before backends existed measured transformers' eager
            self.latency.insert(0, "backend", "eager")

    @property
    def dtypes(self) -> list[str]:
        return list(dict.fromkeys(self.latency["dtype"]))

    @property
    def executions(self) -> list[tuple[str, str]]:
        """(backend, dtype) pairs measured, in measuring order."""
        return list(dict.fromkeys(zip(self.latency["backend"], self.latency["dtype"])))

    def latency_ms(self, dtype: str, n: float, context: float, backend: str = "eager") -> float:
        """L(n, context) in ms: linear in n between measured sizes, then linear in context (extrapolated beyond)."""
        rows = self.latency[(self.latency["dtype"] == dtype) & (self.latency["backend"] == backend)]
        if rows.empty:
            have = ", ".join(f"{b}/{d}" for b, d in self.executions)
            raise SpecbenchError(f"the machine profile has no backend/dtype '{backend}/{dtype}'; it has: {have}")
        contexts = sorted(set(rows["context"]))
        at = [_interp(n, *rows[rows["context"] == c].sort_values("tokens")[["tokens", "ms"]].T.values)
              for c in contexts]
        return _interp(context, np.array(contexts, dtype=float), np.array(at))

    def curve(self, dtype: str, context: float, backend: str = "eager") -> pd.DataFrame:
        """L(n) at one context over the measured sizes, as the tokens/ms frame latency_profile returns."""
        sizes = sorted(set(self.latency["tokens"]))
        return pd.DataFrame({"tokens": sizes, "ms": [self.latency_ms(dtype, n, context, backend) for n in sizes]})

    def covers(self, dtypes, sizes, contexts, backends=("eager",)) -> bool:
        have = set(zip(self.latency["backend"], self.latency["dtype"], self.latency["context"], self.latency["tokens"]))
        skipped = set(self.machine.get("unsupported", {}))  # backend/dtype pairs this machine cannot run
        return all((b, d, c, n) in have or f"{b}/{d}" in skipped
                   for b in backends for d in dtypes for c in contexts for n in sizes)

    def to_json(self) -> str:
        return json.dumps({"machine": self.machine, "device": self.device, "model": self.model, "peaks": self.peaks,
                           "latency": self.latency.to_dict(orient="records"),
                           "compile_seconds": self.compile_seconds}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "MachineProfile":
        data = json.loads(text)
        return cls(data["machine"], data["device"], data["model"], data["peaks"], pd.DataFrame(data["latency"]),
                   data.get("compile_seconds", {}))


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """np.interp inside the measured range, the end segments' slopes outside it."""
    if len(xs) == 1:
        return float(ys[0])
    if x < xs[0]:
        return float(ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0]))
    if x > xs[-1]:
        return float(ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return float(np.interp(x, xs, ys))


def profile_path(model_name: str, device: torch.device | str) -> Path:
    return profile_dir() / f"{fingerprint()}-{torch.device(device).type}-{model_name}.json"


def load_or_measure_profile(target: LoadedModel, dtypes=None, sizes=SIZES, contexts=CONTEXTS,
                            repeats: int = 3, backends=("eager",)) -> MachineProfile:
    """The cached profile of `target` on this machine, measured now (peaks too; cached) when it lacks a requested
    point. Each point is the fastest of `repeats` forwards, and the load average before and after is kept, so a
    profile taken on a busy machine can be told apart. Each dtype is timed on a copy of the target cast to it: a
    forward's cost depends on the dtype, not on the weights' values. A backend that cannot run a dtype here (oneDNN
    packing bf16 without AVX-512) is recorded as unsupported, with the reason, rather than measured."""
    device = target.model.device
    dtypes, sizes, contexts = list(dtypes or default_dtypes(device)), list(sizes), list(contexts)
    backends = list(backends or BACKENDS)
    path = profile_path(target.name, device)
    cached = MachineProfile.from_json(path.read_text()) if path.exists() else None
    if cached is not None and cached.covers(dtypes, sizes, contexts, backends):
        return cached
    print(f"measuring this machine's profile of {target.name} once ({', '.join(backends)} x {', '.join(dtypes)}; "
          f"minutes), cached at {path}")
    load_before, frames, unsupported, compile_s = os.getloadavg()[0], [], {}, {}
    peaks = measure_peaks(device)
    for name in dtypes:
        cast = with_dtype(target, name)
        for backend in backends:
            reason = supported(backend, torch_dtype(name), device)
            if reason:
                unsupported[f"{backend}/{name}"] = reason
                print(f"  {backend}/{name}: not measured: {reason}")
                continue
            run = with_backend(cast, backend)
            frame = latency_profile(run.model, sizes, contexts, repeats, statistic="min")
            frames.append(frame.assign(backend=backend, dtype=name))
            stats = getattr(run.model, "compile_stats", None)
            if stats is not None:
                compile_s[f"{backend}/{name}"] = stats.seconds
            print(f"  {backend}/{name}: L(1) {frame['ms'].iloc[0]:.1f} ms, L({sizes[-1]}) {frame['ms'].iloc[len(sizes) - 1]:.1f}"
                  f" ms at context {contexts[0]}" + (f"; compiled in {stats.seconds:.0f} s" if stats else ""))
            del run
        del cast
    machine = {**machine_info(), "loadavg_1min": [load_before, os.getloadavg()[0]], "cpus": os.cpu_count(),
               "unsupported": unsupported}
    profile = MachineProfile(machine, device.type, target.name, peaks,
                             pd.concat(frames, ignore_index=True)[["backend", "dtype", "context", "tokens", "ms"]],
                             compile_s)
    if busy(machine):  # a profile taken beside other work would mislead every later run on this machine
        print(f"warning: the machine was busy while profiling (1-min load {max(machine['loadavg_1min']):.1f} on "
              f"{machine['cpus']} CPUs): this run uses the profile, but it is not cached; profile on a quiet machine")
        return profile
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.to_json())
    return profile


def busy(machine: dict) -> bool:
    """More runnable threads than cores besides this process's own (about one per core it uses)."""
    return max(machine.get("loadavg_1min", [0.0])) > machine.get("cpus", 1) + 1


def choose_execution(profile: MachineProfile, tree_size: float, context: float, backends=None,
                     dtypes=None) -> tuple[str, str, str]:
    """(backend, dtype, reason): the measured pair with the cheapest verify forward L(tree_size) among the allowed
    ones, and a one-line reason naming the fastest plain decoding L(1) on the machine: a method must beat that,
    whatever its backend and dtype."""
    allowed = [(b, d) for b, d in profile.executions
               if (backends is None or b in backends) and (dtypes is None or d in dtypes)]
    if not allowed:
        have = ", ".join(f"{b}/{d}" for b, d in profile.executions)
        raise SpecbenchError(f"the machine profile has no measurement for backend {backends} and dtype {dtypes}; "
                             f"it has: {have}")
    verify = {e: profile.latency_ms(e[1], tree_size, context, e[0]) for e in allowed}
    best = min(verify, key=verify.get)
    plain_b, plain_d = fastest_plain(profile, context)
    others = ", ".join(f"{b}/{d} {ms:.1f} ms" for (b, d), ms in verify.items() if (b, d) != best)
    reason = (f"{best[0]}/{best[1]}: L({tree_size:g}) at context {context:g} is {verify[best]:.1f} ms"
              + (f" (vs {others})" if others else "") + f"; fastest plain decoding is {plain_b}/{plain_d} at L(1) = "
              f"{profile.latency_ms(plain_d, 1, context, plain_b):.1f} ms")
    return best[0], best[1], reason


def fastest_plain(profile: MachineProfile, context: float) -> tuple[str, str]:
    """(backend, dtype) of the cheapest one-token forward: the plain decoding every speedup is judged against."""
    return min(profile.executions, key=lambda e: profile.latency_ms(e[1], 1, context, e[0]))


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
    frame = profile.latency.copy()  # the roofline depends on the dtype only: it is what every backend aims at
    points = list(zip(frame["dtype"], frame["context"], frame["tokens"]))
    frame["roofline_ms"] = [1e3 * roofline_step_time(shape, hw, n, c, dtype=d) for d, c, n in points]
    bare = dataclasses.replace(hw, layer_overhead_ms=0.0)
    frame["bound_ms"] = [1e3 * roofline_step_time(shape, bare, n, c, dtype=d) for d, c, n in points]
    frame["error_pct"] = 100 * (frame["roofline_ms"] - frame["ms"]) / frame["ms"]
    return frame
