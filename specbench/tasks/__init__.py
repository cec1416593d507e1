"""What `python run.py task=NAME` does: each module here has run(cfg)."""

from __future__ import annotations

import importlib
import pkgutil

from specbench.errors import SpecbenchError
from specbench.schema import validate


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def dispatch(cfg):
    """Run cfg.task once every setting has been checked (specbench.schema), so bad input fails before anything loads."""
    if cfg.task not in available():
        raise SpecbenchError(f"task '{cfg.task}' is unknown; valid choices: {', '.join(available())}")
    validate(cfg)
    return importlib.import_module(f"specbench.tasks.{cfg.task}").run(cfg)
