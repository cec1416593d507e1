"""A folder keyed on its settings: the settings.json it was made with, read back with a damaged file as one line, and
compared key by key with a rerun's, so a refusal names the keys that differ. The eval run folder
(evaluation/run_folder.py) and the training folder (training/folder.py) both keep one: records or checkpoints made
with other settings are never mixed with a rerun's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from specbench.errors import SpecbenchError

SETTINGS_FILE = "settings.json"


def read_settings_file(path: Path, is_valid: Callable[[object], bool], shape: str) -> dict:
    """The JSON object at path, checked by is_valid; one line naming the file (and `shape`, what it must be) when it
    is not JSON or not such settings."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecbenchError(f"{path} is not JSON ({exc}): put the run's own {SETTINGS_FILE} back, or give another "
                             f"hydra.run.dir") from None
    if not is_valid(old):
        raise SpecbenchError(f"{path} is not a settings file: it must be {shape}; put the run's own {SETTINGS_FILE} "
                             f"back, or give another hydra.run.dir")
    return old


def settings_diff(old, new, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, old value, new value) for every leaf that differs, keys in order."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(old.keys() | new.keys(), key=str):
            out += settings_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]


def shown(diffs: list[tuple[str, object, object]]) -> str:
    """The differing keys as `key: old -> new`, the first six."""
    return "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs[:6]) + ("; ..." if len(diffs) > 6 else "")
