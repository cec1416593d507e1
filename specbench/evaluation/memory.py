"""Peak memory a method's decoding allocates: its KV caches and activations, on top of the weights.

On CUDA, torch's allocator keeps the peak (reset before the generation). On CPU there is no allocator statistic, and
the process's RSS high-water mark is shared by every method of the run, so the peak is measured with torch's
profiler: each op's net allocation (self_cpu_memory_usage) in time order gives the live-bytes timeline of the tensors
the generation allocates, whose maximum is the peak. The profiler slows the generation, so this runs once per method
on a short probe generation, apart from the timed ones.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def peak_allocated_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of the tensors allocated while fn runs, above what was live when it started."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    with _native_stderr_muted(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


@contextmanager
def _native_stderr_muted():
    """Kineto writes `USDT ... profiler_start/stop` lines to the process's stderr from C++ on every profile, and no
    KINETO_* or TORCH_CPP_LOG_LEVEL setting of this torch build silences them; they landed in the middle of the
    run's printed table. Python's own sys.stderr (errors, warnings) is left alone: only fd 2 is pointed elsewhere."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
