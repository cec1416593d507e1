"""The openvino backend's settings, checked before any model loads: installed, float32 activations, a weight format
NNCF compresses (or OpenVINO's own int8-activation formats), an int4 group dividing the model's widths."""

from __future__ import annotations

import math

import torch

from specbench.errors import SpecbenchError
from specbench.models.shape import cache_problem, linear_input_widths

INSTALL = "a core dependency: pip install -e . installs it"
# the formats that are OpenVINO's own (its dynamic quantisation of activations), each compiling the int4 IR:
# w4a8_g<group> for plain decoding, w4a8r_g<group> its row-invariant verify target (route.py says how each runs)
OWN_FORMATS = ("w4a8", "w4a8r")
ROW_INVARIANT_FORMAT = "w4a8r_g<group>"


def unsupported(dtype: torch.dtype, device: torch.device, weights: str = "fp") -> str | None:
    """None when OpenVINO can run this execution here, else why not (one line)."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError:
        return f"OpenVINO is not installed ({INSTALL})"
    if device.type != "cpu":
        return "the openvino backend runs on the CPU"
    if dtype != torch.float32:
        return "the openvino backend runs float32 activations (eval.dtype=float32)"
    if weights == "w8a8":
        return ("the openvino backend compresses weights only (fp, int8, int4_g<group>) or with OpenVINO's own "
                "activation quantisation (w4a8_g<group>), not w8a8")
    return None


def check_run(dtype: str, weights: str, config=None, batch_size: int = 1) -> None:
    """model.backend=openvino's settings, before any model loads: installed, float32 (or auto) activations, weights
    NNCF compresses, an int4 group dividing the model's widths and full-attention layers when its config is known,
    batch 1 for w4a8r."""
    reason = (unsupported(torch.float32, torch.device("cpu"), weights) or group_problem(config, weights)
              or cache_problem(config))
    if reason:
        raise SpecbenchError(f"model.backend=openvino with model.weights={weights}: {reason}")
    if dtype not in ("float32", "auto"):
        raise SpecbenchError(f"model.backend=openvino with eval.dtype={dtype}: the openvino backend runs float32 "
                             f"activations; set eval.dtype=float32")
    if weights.partition("_g")[0] == "w4a8r" and batch_size != 1:
        raise SpecbenchError(f"model.weights={weights} with eval.batch_size={batch_size}: the row-invariant route "
                             f"decodes one prompt at a time; set eval.batch_size=1 (or model.weights=int4)")


def group_error(group_size) -> str | None:
    """Why model.group_size cannot group NNCF's int4 compression, None when it can: NNCF quantises each linear's input
    channels in groups of any size that divides them (group_problem checks that once the model's config is known)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        return ("NNCF compresses a linear's input channels in groups of this many; give a positive integer dividing "
                "every linear's input channels")
    return None


def group_problem(config, weights: str) -> str | None:
    """Why NNCF cannot compress this model's linears to `weights` (int4_g<group>: the group must divide every
    linear's input width), None when it can or the config is unknown."""
    if config is None or weights.partition("_g")[0] not in ("int4", *OWN_FORMATS):
        return None
    group = int(weights.rpartition("_g")[2])
    widths = linear_input_widths(config)
    if any(n % group for n in widths):
        common = math.gcd(*widths)
        fits = [g for g in range(16, common + 1) if common % g == 0]
        return (f"NNCF groups every linear's input channels by it, so it must divide each of them "
                f"({', '.join(map(str, widths))})" + (f"; give one of {', '.join(map(str, fits))}" if fits else ""))
    return None
