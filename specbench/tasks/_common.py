"""Pieces every task shares: the run folder and building the target on the chosen hardware."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from specbench.config import build
from specbench.errors import SpecbenchError
from specbench.evaluation.precision import AUTO
from specbench.evaluation.run_folder import RECORDS_FILE
from specbench.hardware.measured import with_measurements
from specbench.hardware.measured.attention import eager_windows
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.execution.attention import with_attention
from specbench.execution.backends import RUN_KEYS
from specbench.models.loading import LoadedModel
from specbench.reporting.paper_table import project_path

RESUMING = ("eval", "train")  # a rerun into their folder resumes it, and their settings.json refuses other settings


def run_dir(cfg) -> Path:
    """Hydra's output dir inside a Hydra run; cfg.run_dir when composed elsewhere (tests, notebooks)."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.run_dir)


def check_run_folder(cfg, folder: Path, overrides: list[str]) -> None:
    """hydra.run.dir, checked before Hydra writes into it (cli.WritableRunFolder): never the run a replay reads, nor
    a folder holding a run of another task, whose files (summary.csv, .hydra/) this one would replace. A folder of
    this task is resumed (eval and train, under their settings.json) or rerun by the same command; any other
    settings would replace its results."""
    folder = folder.expanduser().resolve()
    replayed = OmegaConf.select(cfg, "replay.run") if cfg.task == "replay" else None
    if replayed and project_path(replayed).resolve() == folder:
        raise SpecbenchError(f"hydra.run.dir={folder} is replay.run, the run the replay reads: a replay writes its "
                             f"own summary.csv and replay.csv, which would replace the run's; leave hydra.run.dir "
                             f"out (a new folder under outputs/replay/) or give another")
    task, ran = _folder_run(folder)
    if task is not None and task != cfg.task:
        raise SpecbenchError(f"hydra.run.dir={folder} holds a finished task={task} run, whose files task={cfg.task} "
                             f"would replace: give a new hydra.run.dir (or leave it out for a fresh one)")
    ours = sorted(o for o in overrides if not o.startswith("hydra."))
    if task is not None and task not in RESUMING and ran is not None and ran != ours:
        raise SpecbenchError(f"hydra.run.dir={folder} holds a task={task} run of other settings ({' '.join(ran)}), "
                             f"whose results this one would replace: give a new hydra.run.dir (or leave it out for a "
                             f"fresh one)")


def _folder_run(folder: Path) -> tuple[str | None, list[str] | None]:
    """(the task of the run a folder holds, its command line's overrides less hydra's), from Hydra's saved config;
    a folder of records (an evaluation kept without .hydra/, as experiments/ are) is an eval run; (None, None) for
    a new or empty folder."""
    saved = folder / ".hydra"
    try:
        config = yaml.safe_load((saved / "config.yaml").read_text())
        overrides = yaml.safe_load((saved / "overrides.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        config = overrides = None
    task = config.get("task") if isinstance(config, dict) else None
    if task is None and (folder / RECORDS_FILE).exists():
        return "eval", None
    ran = sorted(str(o) for o in overrides if not str(o).startswith("hydra.")) if isinstance(overrides, list) else None
    return (str(task) if task is not None else None), ran


def load_dtype(cfg) -> str:
    """The dtype a task loads the target in: eval.dtype, or float32 under auto (the dtype that proves losslessness;
    the evaluator casts it once the machine profile has chosen)."""
    return "float32" if cfg.eval.dtype == AUTO else cfg.eval.dtype


def build_hw(cfg) -> HardwareSpec:
    """The `hw` config's spec; hw=cpu and hw=cuda read their `measured` figures from this machine's profile."""
    return with_measurements(build(cfg.hw))


def build_model(model_cfg, **kwargs) -> LoadedModel:
    """The model a `model` config names, on transformers' eager forward: its RUN_KEYS (backend) are run settings a
    task applies once the machine profile has chosen (execution/backends.py), not arguments of the loaders."""
    return build(OmegaConf.masked_copy(model_cfg, [k for k in model_cfg if k not in RUN_KEYS]), **kwargs)


def setup_target(cfg, dtype: str | None = None) -> tuple[HardwareSpec, LoadedModel]:
    """The hardware spec (its device checked and activated) and the target in `dtype` (default: load_dtype), on the
    eager backend, with model.attention set: a task casts it first and then applies model.backend (training needs
    eager's backward)."""
    hw = build_hw(cfg)
    device = hw.activate()
    torch.manual_seed(cfg.seed)
    target = build_model(cfg.model, dtype=dtype or load_dtype(cfg), device=str(device))
    attention = cfg.model.get("attention", "sdpa")
    target = with_attention(target, attention, eager_windows(target.model) if attention == "auto" else None)
    check_context(cfg.eval.max_new_tokens, target)
    return hw, target


def check_context(max_new_tokens: int, target: LoadedModel) -> None:
    """The model's context is known only once it loads (specbench.schema bounds max_new_tokens before that): an
    answer longer than the context less one prompt token could never be decoded."""
    if max_new_tokens > target.max_context - 1:
        raise SpecbenchError(f"eval.max_new_tokens={max_new_tokens} is invalid: it must be an integer <= "
                             f"{target.max_context - 1} (model {target.name}'s context of {target.max_context} "
                             f"tokens less one prompt token)")
