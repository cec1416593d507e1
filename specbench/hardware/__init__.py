"""Hardware modelling: device specs, the roofline cost model and the measured latency profile L(n)."""

from specbench.hardware.roofline import ModelShape, roofline_step_time
from specbench.hardware.spec import HardwareSpec

__all__ = ["HardwareSpec", "ModelShape", "roofline_step_time"]
