"""Files inside the offline data packages (MT-Bench, HumanEval, ShareGPT are pip packages, never fetched)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from specbench.errors import SpecbenchError


def package_file(module: str, rel: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError(f"dataset package '{module}' is not installed; install it with `{install}`")
    path = Path(spec.submodule_search_locations[0]) / rel
    if not path.exists():
        raise SpecbenchError(f"dataset file '{path}' is missing from package '{module}'")
    return path
