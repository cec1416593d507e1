"""A hardware backend: where the run executes, and the figures the cost models read.

A spec is either a datasheet (jetson, a100, ...: every figure sourced in its conf/hw file) or the machine at hand
(hw=cpu, hw=cuda: `measured` figures, read from the cached machine profile: hardware/measured/machine_profile.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Callable

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.models.shape import check_dtype

MEASURED = "measured"
PARTITIONS = ("gpu_only", "megatron", "hcmp")
UNIT_KINDS = ("cpu", "gpu", "npu")
# Figures every hw file states; `measured` (all but storage) reads them from this machine's profile.
REQUIRED = {"peak_tflops": "{dtype: dense matrix TFLOP/s} or measured",
            "mem_bandwidth_gbs": "DRAM bandwidth in GB/s or measured",
            "layer_overhead_ms": "fixed cost per transformer layer per forward (launches, dispatch) or measured",
            "memory_gb": "the memory the target may occupy in GB (DRAM capacity, or a budget below it) or measured", "storage_bandwidth_gbs": "storage read bandwidth in GB/s"}


@dataclass(frozen=True)
class ProcessingUnit:
    """One processing unit of a board: its own peaks and the DRAM bandwidth it can draw on its own."""

    name: str
    kind: str
    peak_tflops: dict
    mem_bandwidth_gbs: float

    def peak_flops(self, dtype: str) -> float:
        return _peak(self.peak_tflops, dtype, f"unit '{self.name}'") * 1e12


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    device: str = "cpu"  # where this process runs: cpu, cuda[:N], mps, or auto (cuda when present, else cpu)
    num_threads: int | None = None
    peak_tflops: dict | str | None = None  # {dtype: TFLOP/s} of the whole device, or "measured"
    mem_bandwidth_gbs: float | str | None = None
    layer_overhead_ms: float | str | None = None
    memory_gb: float | None = None  # LLMCad: the target's weights beyond what fits here stream from storage
    storage_bandwidth_gbs: float | None = None
    weight_dtype: str | None = None  # what the board runs (its bytes per parameter); None: the local run's dtype
    unified_memory: bool = False  # the units share one DRAM: Ghidorah's partitions need it
    units: list = field(default_factory=list)  # ProcessingUnit fields per unit; Ghidorah splits work across them
    sync_ms: float = 0.0  # cross-unit synchronisation per partitioned op (Ghidorah: < 0.1 ms on Xavier NX)
    partition: str = "gpu_only"  # gpu_only | megatron | hcmp (Ghidorah, simulated)
    measure: Callable[[torch.device], dict] | None = field(default=None, compare=False, repr=False)  # peaks on device

    def __post_init__(self) -> None:
        for f in fields(self):  # Hydra hands DictConfig/ListConfig; keep plain containers
            value = getattr(self, f.name)
            if isinstance(value, (DictConfig, ListConfig)):
                object.__setattr__(self, f.name, OmegaConf.to_container(value, resolve=True))
        if self.device not in ("auto", "cpu", "cuda", "mps") and not self.device.startswith("cuda:"):
            raise SpecbenchError(f"hw.device='{self.device}' is unknown; valid: auto, cpu, cuda, cuda:N, mps")
        for key, what in REQUIRED.items():
            value = getattr(self, key)
            if value is None:
                raise SpecbenchError(f"hw '{self.name}' is missing {key} ({what}); add it to conf/hw/{self.name}.yaml")
            if value == MEASURED and key == "storage_bandwidth_gbs":
                raise SpecbenchError(f"hw '{self.name}': {key}=measured is not supported; give {what}")
        if isinstance(self.peak_tflops, dict):
            for dtype, value in self.peak_tflops.items():
                check_dtype(dtype, f"hw '{self.name}' peak_tflops")
                _positive(self.name, f"peak_tflops.{dtype}", value)
        elif self.peak_tflops != MEASURED:
            raise SpecbenchError(f"hw '{self.name}': peak_tflops={self.peak_tflops!r} is invalid; "
                                 f"valid: a mapping {{dtype: TFLOP/s}} or measured")
        for key in ("mem_bandwidth_gbs", "memory_gb", "storage_bandwidth_gbs"):
            if getattr(self, key) != MEASURED:
                _positive(self.name, key, getattr(self, key))
        if self.layer_overhead_ms != MEASURED and (not isinstance(self.layer_overhead_ms, (int, float))
                                                   or self.layer_overhead_ms < 0):
            raise SpecbenchError(f"hw '{self.name}': layer_overhead_ms={self.layer_overhead_ms!r} is invalid; "
                                 f"valid: a number >= 0 or measured")
        if self.weight_dtype is not None:
            check_dtype(self.weight_dtype, f"hw '{self.name}' weight_dtype")
        if self.partition not in PARTITIONS:
            raise SpecbenchError(f"hw.partition='{self.partition}' is unknown; valid: {', '.join(PARTITIONS)}")
        object.__setattr__(self, "units", [u if isinstance(u, ProcessingUnit) else self._unit(u) for u in self.units])
        if self.partition != "gpu_only" and (len(self.units) < 2 or not self.unified_memory):
            raise SpecbenchError(f"hw.partition='{self.partition}' splits work across units sharing one DRAM; "
                                 f"hw '{self.name}' has {len(self.units)} unit(s), unified_memory={self.unified_memory}"
                                 f"; use partition=gpu_only or a board such as hw=jetson")

    def _unit(self, spec: dict) -> ProcessingUnit:
        missing = [k for k in ("name", "kind", "peak_tflops", "mem_bandwidth_gbs") if k not in spec]
        if missing:
            raise SpecbenchError(f"hw '{self.name}': a unit is missing {', '.join(missing)}; each unit needs "
                                 f"name, kind ({'/'.join(UNIT_KINDS)}), peak_tflops and mem_bandwidth_gbs")
        if spec["kind"] not in UNIT_KINDS:
            raise SpecbenchError(f"hw '{self.name}': unit kind '{spec['kind']}' is unknown; valid: "
                                 f"{', '.join(UNIT_KINDS)}")
        _positive(self.name, f"unit {spec['name']} mem_bandwidth_gbs", spec["mem_bandwidth_gbs"])
        for dtype, value in spec["peak_tflops"].items():
            check_dtype(dtype, f"hw '{self.name}' unit {spec['name']}")
            _positive(self.name, f"unit {spec['name']} peak_tflops.{dtype}", value)
        return ProcessingUnit(**spec)

    # The figures, with `measured` ones read from this machine's profile through `measure` (hardware/measured sets
    # it: this half models hardware and never measures, so the cost models need no measuring code below them).
    @cached_property
    def _measured(self) -> dict:
        device = self.activate()
        if self.measure is None:
            raise SpecbenchError(f"hw '{self.name}' has measured figures but nothing to measure them with; build it "
                                 f"with specbench.hardware.measured.with_measurements")
        return self.measure(device)

    def figure(self, key: str):
        """One of the REQUIRED figures by its own name (peak_tflops: {dtype: TFLOP/s}, mem_bandwidth_gbs, memory_gb:
        the memory the target may occupy, layer_overhead_ms, storage_bandwidth_gbs), read from this machine's
        profile where the spec says `measured`: one name per figure, in the config and in the code."""
        if key not in REQUIRED:
            raise SpecbenchError(f"hw figure '{key}' is unknown; valid: {', '.join(REQUIRED)}")
        value = getattr(self, key)
        return self._measured[key] if value == MEASURED else value

    def peak_flops(self, dtype: str) -> float:
        return _peak(self.figure("peak_tflops"), dtype, f"hw '{self.name}'") * 1e12

    def unit(self, kind: str) -> ProcessingUnit:
        for u in self.units:
            if u.kind == kind:
                return u
        have = ", ".join(f"{u.name} ({u.kind})" for u in self.units) or "none"
        raise SpecbenchError(f"hw '{self.name}' has no {kind} unit (units: {have}); a simulated partition needs a "
                             f"board with a gpu and a cpu unit, e.g. hw=jetson")

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


def _positive(name: str, key: str, value) -> None:
    if not isinstance(value, (int, float)) or value <= 0:
        raise SpecbenchError(f"hw '{name}': {key}={value!r} is invalid; it must be a number > 0")


def _peak(peaks: dict, dtype: str, where: str) -> float:
    if dtype not in peaks:
        raise SpecbenchError(f"{where} has no peak for dtype '{dtype}'; it has: {', '.join(peaks)}")
    return peaks[dtype]
