"""The measured profile set against the roofline: the hardware spec of the measured peaks, and L(n, context) measured
beside what the roofline of those peaks predicts."""

from __future__ import annotations

import dataclasses

import pandas as pd

from specbench.hardware.measured.machine_profile import MachineProfile
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.models.shape import ModelShape


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
