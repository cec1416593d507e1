"""Which backend, dtype and weights a run decodes in, and which plain decoding is fastest on this machine.

The answer depends on the machine: on a CPU without native bf16, a bf16 forward of n tokens grows steeply with n
while fp32 stays flat; with AVX-512 bf16 it is the other way round; and a compiled or prepacked forward moves both.
model.backend=auto and eval.dtype=auto read the measured machine profile (hardware/machine_profile.py) and pick the
pair with the cheapest verify forward at the run's tree size; the run also runs plain decoding on the pair
with the cheapest one-token forward, so every speedup can be read against the fastest plain decoding on the
machine, not only the same-dtype, same-backend one.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.errors import SpecbenchError
from specbench.hardware.measured.choice import choose_execution, fastest_plain
from specbench.hardware.measured.machine_profile import MachineProfile
from specbench.execution.backends import AUTO, check_backend
from specbench.execution.value import Execution
from specbench.models.loading import DTYPES


@dataclass(frozen=True)
class ExecutionPlan:
    backend: str  # the run's backend
    dtype: str  # the run's dtype
    reason: str  # why, in one line
    fastest_plain: Execution  # the fastest plain decoding here, any weights
    weights: str = "fp"  # the run's weights: fp, int8 or int4_g<group> (execution/quantize.py)
    fastest_same: Execution | None = None  # the fastest plain decoding of the run's own weights (None: the
    # run's own execution): the headline's reference, as every paper compares speculation with the same model

    @property
    def own(self) -> Execution:
        return Execution(self.backend, self.dtype, self.weights)

    @property
    def same_weights_plain(self) -> Execution:
        return self.fastest_same or self.own

    def label_of(self, execution: Execution) -> str:
        """How a plain decoding on `execution` is labelled beside the run's own: plain@<what differs>."""
        return "/".join(x for x, own in zip(execution, self.own) if x != own)


def check_dtype(name: str) -> None:
    if name != AUTO and name not in DTYPES:
        raise SpecbenchError(f"eval.dtype='{name}' is unknown; valid choices: {AUTO}, {', '.join(DTYPES)}")


def plan(dtype: str, backend: str, profile: MachineProfile | None, tree_size: float, context: float,
         weights: str = "fp", profile_weights=None, answer: tuple[float, int] = ()) -> ExecutionPlan:
    """dtype, backend, weights: auto or a name each (weights a format name: fp, int8, int4_g32); profile: None when
    nothing asks for it (all set, no fastest-plain decoding, no hardware-aware tree). profile_weights: the formats the
    fastest plain decoding and weights=auto choose among (None: every one the profile measured). answer: (prompt
    tokens, new tokens) of a typical answer, which the fastest plain decoding is ranked by (fastest_plain); none: by
    one token's forward."""
    check_dtype(dtype)
    check_backend(backend)
    given = f"{Execution(backend, dtype, weights).label}: set by model.backend, eval.dtype and model.weights"
    if profile is None:
        if AUTO in (dtype, backend, weights):
            raise SpecbenchError("eval.dtype=auto, model.backend=auto and model.weights=auto need the machine profile")
        return ExecutionPlan(backend, dtype, given, Execution(backend, dtype, weights), weights)
    fastest = fastest_plain(profile, context, profile_weights, *answer)
    if AUTO not in (dtype, backend, weights):
        return ExecutionPlan(backend, dtype, given, fastest, weights, _fastest_same(profile, context, weights, answer))
    measured = list(profile_weights) if profile_weights is not None else list(
        dict.fromkeys(e.weights for e in profile.executions))
    chosen, reason = choose_execution(
        profile, tree_size, context, None if backend == AUTO else [backend], None if dtype == AUTO else [dtype],
        measured if weights == AUTO else [weights], fastest)
    return ExecutionPlan(chosen.backend, chosen.dtype, reason, fastest, chosen.weights,
                         _fastest_same(profile, context, chosen.weights, answer))


def _fastest_same(profile: MachineProfile, context: float, weights: str, answer: tuple = ()) -> Execution | None:
    """The fastest measured plain decoding of `weights` (any backend and dtype), None when none was measured."""
    if not any(e.weights == weights for e in profile.executions):
        return None
    return fastest_plain(profile, context, [weights], *answer)
