"""Peak memory a method's decoding allocates: its KV caches and activations, on top of the weights.

On CUDA, torch's allocator keeps the peak (reset before the generation). On CPU there is no allocator statistic, and
the process's RSS high-water mark is shared by every method of the run, so the peak is measured with torch's
profiler: each op's net allocation (self_cpu_memory_usage) in time order gives the live-bytes timeline of the tensors
the generation allocates, whose maximum is the peak. The profiler slows the generation, so this runs once per method
on a short probe generation, apart from the timed ones.
"""

from __future__ import annotations

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
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak
