"""Hydra instantiate, with our own input errors surfaced as they are, and the resolvers our configs use.

Hydra wraps every exception raised by a _target_ in an InstantiationException with a multi-line message; a
SpecbenchError inside is the one line the user needs, so it is re-raised unwrapped.
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError

CONF_DIR = Path(__file__).resolve().parent / "conf"  # the config groups ship inside the package (top-level conf/ links here)
RUN_LABEL_CHARS = 80  # of the run folder's name, which also holds the time and the dataset (a name is <= 255 bytes)


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
    """The run folder's name part: the single method, or the listed methods (`methods=[...]`). One safe path
    component whatever the labels hold: a '/' or '..' would move the run folder out of outputs/ before any setting
    is checked (Hydra makes the folder first), so other characters become '_' and the length is capped."""
    if not methods:
        name = str(method_name)
    else:
        names = [str(m.get("label") or m.get("method", "?") if isinstance(m, (dict, DictConfig)) else m)
                 for m in methods]
        name = "+".join(names) if len(names) <= 4 else f"{names[0]}+{len(names) - 1}more"
    return re.sub(r"[^A-Za-z0-9_\-.,=+@\[\]]|\.{2,}", "_", name)[:RUN_LABEL_CHARS]


OmegaConf.register_new_resolver("run_label", run_label, replace=True)
