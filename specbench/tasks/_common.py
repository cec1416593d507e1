"""Pieces every task shares: the run folder and building the target on the chosen hardware."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from specbench.config import build
from specbench.errors import SpecbenchError
from specbench.evaluation.precision import AUTO
from specbench.hardware.measured import with_measurements
from specbench.hardware.measured.attention import eager_windows
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.execution.attention import with_attention
from specbench.execution.backends import RUN_KEYS
from specbench.models.loading import LoadedModel


def run_dir(cfg) -> Path:
    """Hydra's output dir inside a Hydra run; cfg.run_dir when composed elsewhere (tests, notebooks)."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.run_dir)


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
