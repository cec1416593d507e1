"""This machine's peaks: matmul TFLOP/s per dtype (and per quantised kernel), memory-read GB/s, the fixed cost per
transformer layer and DRAM capacity; what the roofline of hw=cpu / hw=cuda reads as `measured`. Measured once per
machine and cached beside the profiles (cache.py)."""

from __future__ import annotations

import json
import math
import os
import time

import torch
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.execution.quantize import Int4Linear, Int8Linear, W8A8Linear
from specbench.execution.quantize import supported as weights_supported
from specbench.files import write_atomic
from specbench.hardware.measured.cache import measuring_alone, profile_dir, read_cached, stamp
from specbench.hardware.measured.machine import fingerprint, machine_info
from specbench.models.loading import torch_dtype


def default_dtypes(device: torch.device | str) -> tuple[str, ...]:
    """The dtypes worth profiling: float16 has fast kernels on CUDA only."""
    return ("float32", "bfloat16", "float16") if torch.device(device).type == "cuda" else ("float32", "bfloat16")


def best_seconds(fn, sync, budget_s: float = 0.5, min_runs: int = 3) -> float:
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
        # the op a model runs: without native bf16 it is far faster than a @ b (experiments/execution_backends)
        linear = torch.nn.functional.linear
        tflops[name] = max(2 * size**3 / best_seconds(lambda: linear(a, a), sync, budget_s),
                           2 * 64 * size**2 / best_seconds(lambda: linear(rows, a), sync, budget_s)) / 1e12
    if weights_supported("int8", device) is None:  # the weight-only kernels' own FLOP/s: they dequantise in registers
        tflops |= _quantised_peaks(size, device, sync, budget_s)
    x = torch.ones(read_mb * 2**18, device=device)  # read_mb of float32
    bandwidth = x.numel() * 4 / best_seconds(x.sum, sync, budget_s) / 1e9
    per_forward = {layers: _one_token_forward_s(tiny_random(num_layers=layers, device=str(device)).model, sync,
                                                budget_s) for layers in (2, 8)}
    memory = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"peak_tflops": tflops, "mem_bandwidth_gbs": bandwidth,
            "layer_overhead_ms": max(0.0, 1e3 * (per_forward[8] - per_forward[2]) / 6), "memory_gb": memory / 1e9}


def _quantised_peaks(size: int, device: torch.device, sync, budget_s: float) -> dict:
    """TFLOP/s of a 64-row product with int8, int4 and w8a8 weights, in bfloat16 activations (the dtype their kernels
    vectorise: float32 activations run several times slower, experiments/fast_forward; task=profile's table shows
    it)."""
    linear = torch.nn.Linear(size, size, bias=False, device=device)
    rows = torch.randn(64, size, device=device, dtype=torch.bfloat16)
    peaks = {}
    layers = {"int8": Int8Linear(linear), "int4": Int4Linear(linear, 32), "w8a8": W8A8Linear(linear)}
    for name, layer in layers.items():
        layer = layer.to(torch.bfloat16)
        peaks[name] = 2 * 64 * size**2 / best_seconds(lambda: layer(rows), sync, budget_s) / 1e12  # noqa: B023
    return peaks


def _one_token_forward_s(model, sync, budget_s: float) -> float:
    """Fastest forward of one token over a 16-token cache."""
    cache = DynamicCache()
    ids = torch.zeros(1, 17, dtype=torch.long, device=model.device)
    model(input_ids=ids[:, :16], past_key_values=cache, use_cache=True)

    def step():
        model(input_ids=ids[:, 16:], past_key_values=cache, use_cache=True)
        cache.crop(-1)
    return best_seconds(step, sync, budget_s)


def measured_peaks(device: torch.device | str) -> dict:
    """This machine's peaks from its newest valid cached profile (of any model), else measured now and cached."""
    device = torch.device(device)
    root, fp = profile_dir(), fingerprint()

    def cached(skip=()) -> dict | None:
        # peaks are the machine's, whatever code measured a profile: any code digest (profile_path) will do
        for path in sorted(root.glob(f"{fp}-*{device.type}-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
            peaks = None if (path, stamp(path)) in skip else read_cached(path, _peaks_of)
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


def _peaks_of(text: str) -> dict:
    data = json.loads(text)
    if not isinstance(data, dict) or "peaks" not in data:
        raise SpecbenchError("the machine profile lacks the key 'peaks'")
    return checked_peaks(data["peaks"])


def _positive(value, zero_ok: bool = False) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value >= 0 if zero_ok else value > 0))


def checked_peaks(peaks) -> dict:
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

