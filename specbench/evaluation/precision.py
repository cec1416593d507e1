"""Which backend and dtype a run decodes in, and which plain decoding is fastest on this machine.

The answer depends on the machine: on a CPU without native bf16, a bf16 forward of n tokens grows steeply with n
while fp32 stays flat; with AVX-512 bf16 it is the other way round; and a compiled or prepacked forward moves both.
model.backend=auto and eval.dtype=auto read the measured machine profile (hardware/machine_profile.py) and pick the
pair with the cheapest verify forward at the run's tree size; the run also decodes plain autoregressive on the pair
with the cheapest one-token forward, so every speedup can be read against the fastest plain decoding on the
machine, not only the same-dtype, same-backend one.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.errors import SpecbenchError
from specbench.hardware.measured.machine_profile import MachineProfile, choose_execution, fastest_plain
from specbench.models.backends import AUTO, check_backend
from specbench.models.loading import DTYPES


@dataclass(frozen=True)
class ExecutionPlan:
    backend: str  # the run's backend
    dtype: str  # the run's dtype
    reason: str  # why, in one line
    fastest_ar: tuple[str, str]  # (backend, dtype) of the fastest plain decoding here

    @property
    def fastest_ar_label(self) -> str:
        """How the fastest plain decoding is labelled beside the run's own: autoregressive@<what differs>."""
        backend, dtype = self.fastest_ar
        return "/".join(x for x, own in ((backend, self.backend), (dtype, self.dtype)) if x != own)


def check_dtype(name: str) -> None:
    if name != AUTO and name not in DTYPES:
        raise SpecbenchError(f"eval.dtype='{name}' is unknown; valid choices: {AUTO}, {', '.join(DTYPES)}")


def plan(dtype: str, backend: str, profile: MachineProfile | None, tree_size: float, context: float) -> ExecutionPlan:
    """dtype, backend: auto or a name each; profile: None when nothing asks for it (both set, no fastest-AR
    baseline, no hardware-aware tree)."""
    check_dtype(dtype)
    check_backend(backend)
    if profile is None:
        if AUTO in (dtype, backend):
            raise SpecbenchError("eval.dtype=auto and model.backend=auto need the machine profile")
        return ExecutionPlan(backend, dtype, f"{backend}/{dtype}: set by model.backend and eval.dtype",
                             (backend, dtype))
    fastest = fastest_plain(profile, context)
    if AUTO not in (dtype, backend):
        return ExecutionPlan(backend, dtype, f"{backend}/{dtype}: set by model.backend and eval.dtype", fastest)
    chosen_b, chosen_d, reason = choose_execution(profile, tree_size, context,
                                                  None if backend == AUTO else [backend],
                                                  None if dtype == AUTO else [dtype])
    return ExecutionPlan(chosen_b, chosen_d, reason, fastest)
