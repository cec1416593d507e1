"""Hydra instantiate, with our own input errors surfaced as they are.

Hydra wraps every exception raised by a _target_ in an InstantiationException with a multi-line message; a
SpecbenchError inside is the one line the user needs, so it is re-raised unwrapped.
"""

from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from specbench.errors import SpecbenchError


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
