"""Choosing from a machine profile: the execution whose verify is cheapest among the lossless ones, and the fastest
plain decoding, the reference every speedup is judged against."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.execution.value import Execution
from specbench.hardware.measured.machine_profile import MachineProfile


def choose_execution(profile: MachineProfile, tree_size: float, context: float, backends=None, dtypes=None,
                     weights=None, plain: Execution | None = None) -> tuple[Execution, str]:
    """(execution, reason): the measured execution with the cheapest verify forward L(tree_size) among the allowed
    ones whose rows passed the machine's row check (a verify there keeps its plain decoding's tokens), and a one-line
    reason naming the fastest plain decoding L(1) on the machine (`plain`, default fastest_plain's): a method must
    beat that, whatever its backend, dtype and weights."""
    measured = [e for e in profile.executions
                if (backends is None or e.backend in backends) and (dtypes is None or e.dtype in dtypes)
                and (weights is None or e.weights in weights)]
    if not measured:
        have = ", ".join(e.label for e in profile.executions)
        raise SpecbenchError(f"the machine profile has no measurement for backend {backends}, dtype {dtypes} and "
                             f"weights {weights}; it has: {have}")
    allowed = [e for e in measured if profile.lossless(e)]
    if not allowed:
        raise SpecbenchError("no lossless verify route among " + ", ".join(e.label for e in measured) + " on this "
                             "machine: " + "; ".join(f"{e.label}: {profile.rows[e.label].describe()}" for e in measured)
                             + "; allow other backends, dtypes or weights, or name one to run it anyway")
    refused = [e for e in measured if e not in allowed]
    verify = {e: profile.latency_ms(e.dtype, tree_size, context, e.backend, e.weights) for e in allowed}
    best = min(verify, key=verify.get)
    plain = plain or fastest_plain(profile, context)
    others = ", ".join(f"{e.label} {ms:.1f} ms" for e, ms in verify.items() if e != best)
    reason = (f"{best.label}: L({tree_size:g}) at context {context:g} is {verify[best]:.1f} ms"
              + (f" (vs {others})" if others else "") + f"; fastest plain decoding is {plain.label} at "
              f"L(1) = {profile.latency_ms(plain.dtype, 1, context, plain.backend, plain.weights):.1f} ms"
              + (f"; not lossless here, so not chosen: {', '.join(e.label for e in refused)}" if refused else ""))
    return best, reason


def fastest_plain(profile: MachineProfile, context: float, weights=None, prompt: float = 0.0,
                  new_tokens: int = 1) -> Execution:
    """The execution whose plain decoding of a `prompt`-token prompt and `new_tokens` answer tokens costs least by the
    profile (the prompt's one forward, then one-token forwards at `context`), among the measured ones with weights in
    `weights` (None: any): the plain decoding every speedup is judged against, a quantised target's included. The
    prefill counts because the headline's tokens/s does: where a dtype's forward grows steeply with its rows (bf16
    without native bf16 units), the fastest one-token step can still lose the whole answer."""
    allowed = [e for e in profile.executions if weights is None or e.weights in weights] \
        or profile.executions  # none of `weights` could run here (unsupported): any measured one

    def answer_ms(e: Execution) -> float:
        prefill = profile.latency_ms(e.dtype, prompt, 0, e.backend, e.weights) if prompt else 0.0
        return prefill + new_tokens * profile.latency_ms(e.dtype, 1, context, e.backend, e.weights)
    return min(allowed, key=answer_ms)
