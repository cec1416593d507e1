"""task=train: fit the chosen method's drafter with Lightning and export it as a drafter artifact.

The run folder (Hydra's output dir) holds the logger's files, Lightning checkpoints (trainable tensors only), the
settings it was made with (settings.json) and the exported artifact. Rerunning into the same folder
(hydra.run.dir=...) resumes from checkpoints/last.ckpt under the same settings, and is refused under others
(training/folder.py; method.train.resume=false starts over). A run that trained nothing (method.train.max_steps=0:
only prepare and cache the training data) writes no artifact.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from pathlib import Path

import lightning as L
import torch
from hydra.utils import get_class
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from specbench.config import build
from specbench.data.prompts import distilled_turns
from specbench.errors import SpecbenchError
from specbench.evaluation.run_folder import run_folder_lock
from specbench.models.artifact import save_artifact
from specbench.models.loading import cache_root
from specbench.reporting.loggers import log_artifact
from specbench.tasks._common import build_model, run_dir
from specbench.training.curves import TrainingCurves
from specbench.training.datamodule import ShareGPTDataModule
from specbench.training.folder import LAST, open_training_folder

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict:
    return train(cfg, run_dir(cfg))


def make_logger(cfg: DictConfig, run_dir: Path):
    """The run's logger group (csv | wandb offline), writing into this run folder; CSV when none is configured."""
    if OmegaConf.select(cfg, "logger._target_") is None:
        return L.pytorch.loggers.CSVLogger(save_dir=str(run_dir), name="logs", version="")
    return build(cfg.logger, save_dir=str(run_dir))


def device_label(device: torch.device) -> str:
    """What the trainer computes on, for the plot: the GPU's name, or the CPU's capability (AVX512, AVX2, ...)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {torch.backends.cpu.get_cpu_capability()}" if device.type == "cpu" else device.type


def _caption(cfg: DictConfig, device: str) -> str:
    """The training curve's caption: model, where it trained, precision and data."""
    data = cfg.method.train.data
    if data.self_distill is None:
        source = "human-written ShareGPT conversations"
    elif distilled_turns(data.self_distill) == "all":
        source = "self-distilled answers to ShareGPT user turns"
    else:
        source = "self-distilled answers to ShareGPT first turns"
    return (f"{cfg.model.name} | trained on {device} | trainer precision {cfg.trainer.precision} | "
            f"{data.num_conversations} {source} ({data.num_val} held out)")


def train(cfg: DictConfig, run_dir: Path, callbacks: list | None = None) -> dict:
    method = cfg.method.name
    tcfg = OmegaConf.select(cfg, "method.train")
    if tcfg is None:
        raise SpecbenchError(f"method={method} has nothing to train; trainable methods: medusa, ppd, draft_model, "
                             f"eagle")
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = ModelCheckpoint(dirpath=str(run_dir / LAST.parent), save_last=True, save_top_k=1,
                                 every_n_train_steps=tcfg.checkpoint_every_n_steps)
    # plots/training_curves.png: loss, held-out per-position accuracy and tau_sim over the steps
    curves = TrainingCurves(run_dir / "plots" / "training_curves", f"{method} drafter training", caption="")
    trainer = build(cfg.trainer, default_root_dir=str(run_dir), max_epochs=tcfg.epochs,
                    max_steps=tcfg.max_steps, logger=make_logger(cfg, run_dir),
                    callbacks=[checkpoint, curves, *(callbacks or [])])
    # rank 0 checks, writes and locks the folder; DDP's other ranks start inside its fit and resume what it chose
    with run_folder_lock(run_dir) if trainer.is_global_zero else nullcontext():
        if trainer.is_global_zero:
            resume = open_training_folder(run_dir, cfg)
        else:
            resume = run_dir / LAST if (run_dir / LAST).exists() else None
        return _fit(cfg, run_dir, trainer, curves, resume)


def _fit(cfg: DictConfig, run_dir: Path, trainer: L.Trainer, curves: TrainingCurves, resume: Path | None) -> dict:
    method, tcfg = cfg.method.name, cfg.method.train
    target = build_model(cfg.model, dtype=tcfg.dtype)
    extra = {"tokenizer": target.tokenizer} if get_class(tcfg.module._target_).needs_tokenizer else {}
    module = build(tcfg.module, backbone=target.model, **extra)
    curves.caption = _caption(cfg, device_label(trainer.strategy.root_device))  # the device Lightning resolved
    generator = None
    if tcfg.data.self_distill is not None:
        sd_dtype = tcfg.data.self_distill.dtype
        generator = target if sd_dtype == tcfg.dtype else build_model(cfg.model, dtype=sd_dtype)
        # the target writes its answers (and their features) where the drafter trains: prepare_data runs before
        # Lightning moves the module, so on a GPU trainer the generation would otherwise run on the CPU
        generator.model.to(trainer.strategy.root_device)
    data = ShareGPTDataModule(target.tokenizer, tcfg.data.num_conversations, tcfg.data.num_val,
                              tcfg.data.max_length, tcfg.data.batch_size,
                              None if tcfg.data.self_distill is None else OmegaConf.to_container(tcfg.data.self_distill),
                              generator, cache_root() / "training",
                              num_workers=OmegaConf.select(tcfg, "data.num_workers", default=0),
                              feature_cache=OmegaConf.select(tcfg, "data.feature_cache", default=True))
    start = time.time()
    trainer.fit(module, data, ckpt_path=None if resume is None else str(resume))
    fit_time = time.time() - start
    if trainer.global_step == 0:  # heads as initialised are no drafter: nothing to export
        why = "method.train.max_steps=0" if tcfg.max_steps == 0 else "no optimizer step ran"
        if trainer.is_global_zero:
            log.warning("%s: trained nothing, so no artifact is written (the training data is prepared and cached "
                        "under %s)", why, cache_root() / "training")
        return {"artifact": None, "global_step": 0}
    trainer.validate(module, data, verbose=False)  # held-out accuracies of the final weights, for the artifact
    trainable, share = module.trainable_share()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    metrics |= {"rank_accuracy": module.rank_accuracy, "trainable_params": trainable, "trainable_share": share,
                "fit_wall_time_s": fit_time, "global_step": trainer.global_step, "world_size": trainer.world_size}
    train_cfg = OmegaConf.to_container(tcfg, resolve=True)
    summary = {"artifact": str(run_dir / tcfg.export), **{k: v for k, v in metrics.items() if k != "rank_accuracy"}}
    if not trainer.is_global_zero:  # under DDP every rank gets here with the same synced metrics: rank 0 writes
        return summary
    out = save_artifact(run_dir / tcfg.export, method, target, module.arch(), module.export_tensors(), train_cfg,
                        metrics)
    if isinstance(trainer.logger, L.pytorch.loggers.WandbLogger):
        log_artifact(trainer.logger, out, f"{method}-drafter", "drafter")
    summary["artifact"] = str(out)
    (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return summary
