"""A training folder keyed on its settings, as an eval run folder is (reporting/settings.py).

task=train writes the settings that shape the trained weights (model, method.train, trainer) to settings.json before
it fits, and a rerun into the folder (hydra.run.dir=...) resumes checkpoints/last.ckpt only under those settings. A
rerun with others is refused with the differing keys named: Lightning would restore the old checkpoint, train nothing
and export it as if trained under the new settings (another lr, max_length or max_steps), or fail inside the optimizer
(another head count). method.train.resume=false starts over from step 0 instead, the folder's earlier training moved
to earlier/<time>/ inside it, nothing deleted. A last.ckpt cut short is one line, before any model loads.
"""

from __future__ import annotations

import json
import logging
import time
import zipfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.execution.backends import RUN_KEYS
from specbench.files import write_atomic
from specbench.reporting.settings import SETTINGS_FILE, read_settings_file, settings_diff, shown

log = logging.getLogger(__name__)

LAST = Path("checkpoints") / "last.ckpt"
EARLIER = "earlier"  # where method.train.resume=false moves a folder's earlier training
# what start-over leaves in place: this run's own Hydra files and lock (already written), and earlier trainings
KEPT = {".hydra", "specbench.log", ".lock", EARLIER}
# settings that change how a fit is shown, checkpointed, read or named, not the weights it trains
NOT_WEIGHT_KEYS = ("method.train.resume", "method.train.checkpoint_every_n_steps", "method.train.export",
                   "method.train.data.num_workers", "trainer.log_every_n_steps", "trainer.enable_progress_bar",
                   "trainer.enable_model_summary", "trainer.num_sanity_val_steps")
SHAPE = "a JSON object {task: 'train', model: {...}, method: {name, train: {...}}, trainer: {...}}"


def train_settings(cfg: DictConfig) -> dict:
    """The settings a training folder is keyed on: the target (its run-time keys apart: training runs eager), the
    method and its method.train, the trainer; less NOT_WEIGHT_KEYS."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    settings = {"task": "train", "model": {k: v for k, v in model.items() if k not in RUN_KEYS},
                "method": {"name": cfg.method.name, "train": OmegaConf.to_container(cfg.method.train, resolve=True)},
                "trainer": OmegaConf.to_container(cfg.trainer, resolve=True) if cfg.get("trainer") else {}}
    for key in NOT_WEIGHT_KEYS:
        *parents, leaf = key.split(".")
        node = settings
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return settings


def open_training_folder(run_dir: Path, cfg: DictConfig) -> Path | None:
    """Check the folder against this run's settings and write them; the checkpoint to resume from (None: step 0).
    Called by the process that writes the folder, with it locked, before any model or data loads."""
    settings, resume = train_settings(cfg), cfg.method.train.get("resume", True)
    path = run_dir / SETTINGS_FILE
    old = read_settings_file(path, _is_train_settings, SHAPE) if path.exists() else None
    if old is not None or _holds_training(run_dir, cfg.method.train.export):
        if not resume:
            _move_aside(run_dir, old, settings)
        elif old is None:
            raise SpecbenchError(f"training folder '{run_dir}' holds a training but no {SETTINGS_FILE}, so the "
                                 f"settings its checkpoints were made with are unknown: give another hydra.run.dir, "
                                 f"or method.train.resume=false to start over here (its files kept under {EARLIER}/)")
        elif diffs := settings_diff(old, settings):
            raise SpecbenchError(f"training folder '{run_dir}' holds a training made with other settings "
                                 f"({shown(diffs)}); it resumes only under its own: give another hydra.run.dir, or "
                                 f"method.train.resume=false to start over here (its files kept under {EARLIER}/)")
    write_atomic(path, json.dumps(settings, indent=1, sort_keys=True))
    last = run_dir / LAST
    if not last.exists():
        return None
    check_checkpoint(last)
    log.info("resuming the training in %s from %s (same settings)", run_dir, last)
    return last


def check_checkpoint(path: Path) -> None:
    """A Lightning checkpoint is a zip file (torch.save): a cut one has no central directory, a damaged one a
    member whose CRC fails."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        why = None if bad is None else f"its member {bad} fails its CRC check"
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        why = str(exc) or type(exc).__name__
    if why is not None:
        raise SpecbenchError(f"checkpoint '{path}' is cut short or damaged ({why}), so the fit cannot resume from "
                             f"it: rerun with method.train.resume=false to start over from step 0 (the folder's files "
                             f"kept under {EARLIER}/), or give another hydra.run.dir")


def _is_train_settings(old) -> bool:
    return (isinstance(old, dict) and old.get("task") == "train"
            and all(isinstance(old.get(k), dict) for k in ("model", "method", "trainer")))


def _holds_training(run_dir: Path, export: str) -> bool:
    return any((run_dir / LAST.parent).glob("*.ckpt")) or (run_dir / export).exists()


def _move_aside(run_dir: Path, old: dict | None, settings: dict) -> None:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    dest, n = run_dir / EARLIER / stamp, 1
    while dest.exists():
        n += 1
        dest = run_dir / EARLIER / f"{stamp}-{n}"
    dest.mkdir(parents=True)
    for entry in sorted(run_dir.iterdir()):
        if entry.name not in KEPT:
            entry.rename(dest / entry.name)
    why = ("its settings unknown" if old is None
           else f"other settings: {shown(diffs)}" if (diffs := settings_diff(old, settings)) else "the same settings")
    log.warning("method.train.resume=false: the earlier training in %s (%s) moved to %s; training starts from step 0",
                run_dir, why, dest)
