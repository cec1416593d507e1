"""Hydra instantiate, with our own input errors surfaced as they are, and the resolvers our configs use.

Hydra wraps every exception raised by a _target_ in an InstantiationException with a multi-line message; a
SpecbenchError inside is the one line the user needs, so it is re-raised unwrapped.
"""

from __future__ import annotations

from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from specbench.errors import SpecbenchError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # the project's config groups (editable install)


def build(cfg, **kwargs):
    try:
        return instantiate(cfg, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, SpecbenchError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


def run_label(methods, method_name: str) -> str:
    """The run folder's name part: the single method, or the listed methods (`methods=[...]`)."""
    if not methods:
        return method_name
    names = [m if isinstance(m, str) else m.get("label") or m.get("method", "?") for m in methods]
    return "+".join(names) if len(names) <= 4 else f"{names[0]}+{len(names) - 1}more"


OmegaConf.register_new_resolver("run_label", run_label, replace=True)
