"""Where every number comes from, and which settings a run folder was made with.

Every record and summary row carries the provenance (model, dtype, hw, dataset, the machine, library versions, the
project's commit) and a hash of the settings that change results. A rerun into a folder made with other settings
stops with the differing keys named, so records of different settings are never mixed; new methods may be added to a
folder whose shared settings match.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.hardware.machine import machine_info

SETTINGS_FILE = "settings.json"
# eval keys that decide how many prompts run or what is measured on the side, not what a prompt's result is
NOT_RESULT_KEYS = {"num_prompts", "warmup", "latency_profile", "profile_sizes", "profile_context", "profile_repeats",
                   "memory_probe", "fastest_ar", "profile_backends"}


def shared_settings(cfg: DictConfig, dtype: str, backend: str) -> dict:
    """The run-wide settings that change a prompt's result: model and backend, dtype (both auto resolved) and
    decoding settings, data, hw."""
    eval_cfg = {k: v for k, v in OmegaConf.to_container(cfg.eval, resolve=True).items() if k not in NOT_RESULT_KEYS}
    eval_cfg["dtype"] = dtype
    dataset = {k: v for k, v in OmegaConf.to_container(cfg.dataset, resolve=True).items() if k != "num_prompts"}
    model = OmegaConf.to_container(cfg.model, resolve=True) | {"backend": backend}
    return {"model": model, "eval": eval_cfg, "dataset": dataset,
            "sampling": OmegaConf.to_container(cfg.sampling, resolve=True), "seed": cfg.seed,
            "hw": OmegaConf.to_container(cfg.hw, resolve=True)}


def settings_hash(shared: dict, method: dict) -> str:
    return hashlib.sha1(json.dumps({"shared": shared, "method": method}, sort_keys=True, default=str).encode()
                        ).hexdigest()[:12]


def check_and_save_settings(run_dir: Path, shared: dict, methods: dict[str, dict]) -> None:
    """Refuse a folder made with other settings (one line naming the keys); record new methods otherwise."""
    path = run_dir / SETTINGS_FILE
    if path.exists():
        old = json.loads(path.read_text())
        diffs = _diff(old["shared"], shared, "")
        for label in methods.keys() & old["methods"].keys():
            diffs += _diff(old["methods"][label], methods[label], f"methods[{label}].")
        if diffs:
            shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs[:6]) + ("; ..." if len(diffs) > 6 else "")
            raise SpecbenchError(f"run folder '{run_dir}' holds results made with other settings ({shown}); records "
                                 f"of different settings are never mixed: rerun without hydra.run.dir (a new "
                                 f"timestamped folder) or give another hydra.run.dir")
        methods = {**old["methods"], **methods}
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"shared": shared, "methods": methods}, indent=1, sort_keys=True, default=str))


def _diff(old, new, prefix: str) -> list[tuple[str, object, object]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(old.keys() | new.keys(), key=str):
            out += _diff(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The project's commit, '-dirty' when the working tree has uncommitted changes; 'unknown' outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def provenance(cfg: DictConfig, dtype: str, backend: str) -> dict:
    """The columns every record and summary row carries (dtype and backend: the ones the run decodes on, auto
    resolved)."""
    return {"model": cfg.model.name, "dtype": dtype, "backend": backend, "hw": cfg.hw.name, "dataset": cfg.dataset.name,
            **machine_info(), "git_commit": git_commit()}
