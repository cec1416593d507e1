"""Which dtype a run decodes in, and which dtype plain decoding is fastest in on this machine.

The answer depends on the machine: on a CPU without native bf16, a bf16 forward of n tokens grows steeply with n
while fp32 stays flat; with AVX-512 bf16 it is the other way round. eval.dtype=auto reads the measured machine
profile (hardware/machine_profile.py) and picks the dtype with the cheapest verify forward at the run's tree size;
the run also decodes plain autoregressive in the dtype of the cheapest one-token forward, so every speedup can be
read against the fastest plain decoding on the machine, not only the same-dtype one.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.errors import SpecbenchError
from specbench.hardware.machine_profile import MachineProfile, choose_dtype
from specbench.models.loading import DTYPES

AUTO = "auto"


@dataclass(frozen=True)
class DtypePlan:
    dtype: str  # the run's dtype
    reason: str  # why, in one line
    fastest_ar: str  # the dtype of the fastest plain decoding here


def check_dtype(name: str) -> None:
    if name != AUTO and name not in DTYPES:
        raise SpecbenchError(f"eval.dtype='{name}' is unknown; valid choices: {AUTO}, {', '.join(DTYPES)}")


def plan(requested: str, profile: MachineProfile | None, tree_size: float, context: float) -> DtypePlan:
    """requested: auto or a dtype name; profile: None when neither auto nor the fastest-AR baseline asks for it."""
    check_dtype(requested)
    if profile is None:
        return DtypePlan(requested, f"{requested}: set by eval.dtype", requested)
    fastest_ar = min(profile.dtypes, key=lambda d: profile.latency_ms(d, 1, context))
    if requested != AUTO:
        return DtypePlan(requested, f"{requested}: set by eval.dtype", fastest_ar)
    dtype, reason = choose_dtype(profile, tree_size, context)
    return DtypePlan(dtype, reason, fastest_ar)
