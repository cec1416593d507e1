"""Pieces every task shares: the run folder and building the target on the chosen hardware."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

from specbench.config import build
from specbench.hardware.spec import HardwareSpec
from specbench.models.loading import LoadedModel


def run_dir(cfg) -> Path:
    """Hydra's output dir inside a Hydra run; cfg.run_dir when composed elsewhere (tests, notebooks)."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.run_dir)


def setup_target(cfg, dtype: str | None = None) -> tuple[HardwareSpec, LoadedModel]:
    """The hardware spec (its device checked and activated) and the target in `dtype` (default: eval.dtype)."""
    hw: HardwareSpec = build(cfg.hw)
    device = hw.activate()
    torch.manual_seed(cfg.seed)
    return hw, build(cfg.model, dtype=dtype or cfg.eval.dtype, device=str(device))
