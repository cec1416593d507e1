"""What `python run.py task=NAME` does: each module here has run(cfg)."""

from __future__ import annotations

import importlib
import pkgutil

from specbench.errors import SpecbenchError


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def dispatch(cfg):
    if cfg.task not in available():
        raise SpecbenchError(f"task '{cfg.task}' is unknown; valid choices: {', '.join(available())}")
    return importlib.import_module(f"specbench.tasks.{cfg.task}").run(cfg)
