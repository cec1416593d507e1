"""This machine, measured: its fingerprint, peaks and L(n, context) per execution, cached per machine and model."""

from __future__ import annotations

import dataclasses

from specbench.hardware.measured.peaks import measured_peaks
from specbench.hardware.modelled.spec import HardwareSpec


def with_measurements(hw: HardwareSpec) -> HardwareSpec:
    """`hw` whose `measured` figures (hw=cpu, hw=cuda) are read from this machine's profile when first asked for."""
    return dataclasses.replace(hw, measure=measured_peaks)
