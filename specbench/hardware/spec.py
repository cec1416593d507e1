"""A hardware backend: where the run executes (device, threads) and the peak numbers the roofline model uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    device: str = "cpu"  # where this process runs: cpu, cuda[:N], mps, or auto (cuda when present, else cpu)
    num_threads: int | None = None
    peak_tflops: float = 1.0  # dense 16-bit matrix throughput
    mem_bandwidth_gbs: float = 50.0
    memory_gb: float = 16.0
    unified_memory: bool = False  # CPU and accelerator share DRAM (Jetson, Apple): weights are read once for both
    launch_overhead_ms: float = 0.0  # fixed per-forward cost (kernel launches, Python)

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda", "mps") and not self.device.startswith("cuda:"):
            raise SpecbenchError(f"hw.device='{self.device}' is unknown; valid: auto, cpu, cuda, cuda:N, mps")
        if self.peak_tflops <= 0 or self.mem_bandwidth_gbs <= 0:
            raise SpecbenchError(f"hw '{self.name}' needs peak_tflops > 0 and mem_bandwidth_gbs > 0")

    def activate(self) -> torch.device:
        """Check the device exists here and set the thread count; returns the torch device.

        A board this machine is not (hw=jetson on a laptop) uses device=auto: the run executes here and the
        summary's projected_speedup applies the board's roofline."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise SpecbenchError(f"hw={self.name} runs on '{device}' but this machine has no CUDA device; "
                                 f"use hw=cpu, or hw.device=auto to run here and project to {self.name}")
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        return torch.device(device)
