"""Send a run's config, summary and plots to the chosen Lightning logger (CSVLogger, or WandbLogger offline).

Evaluation uses the same logger classes as training so `logger=` means one thing in every task.
"""

from __future__ import annotations

import netrc
import os
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError

SCALARS = ["tau", "tokens_per_s", "decode_tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high", "overhead",
           "ideal_speedup", "efficiency", "projected_speedup", "lossless_match", "method_mem_mb", "framework_ms_per_step",
           "speedup_mean_of_ratios", "speedup_vs_own_plain"]


def check_logger(logger_cfg) -> None:
    """W&B online needs an API key, and a run finds out only when it logs, after decoding: look for one first (the
    places wandb reads: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, ~/.netrc for WANDB_BASE_URL's host)."""
    if logger_cfg is None or not str(logger_cfg.get("_target_", "")).endswith("WandbLogger"):
        return
    if logger_cfg.get("offline", False) or os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise SpecbenchError(f"logger.offline=false sends the run to W&B, but no API key for {host} is set "
                         f"(WANDB_API_KEY, or `wandb login`); log in first, or keep logger.offline=true and "
                         f"`wandb sync` the run folder later")


def log_run(logger, cfg: DictConfig, summary: pd.DataFrame, plots: list[Path], records: Path | None = None) -> None:
    if logger is None:
        return
    logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    metrics = {f"{row['method']}/{k}": float(row[k]) for _, row in summary.iterrows() for k in SCALARS
               if pd.notna(row[k])}
    logger.log_metrics(metrics, step=0)
    if hasattr(logger, "log_table"):  # WandbLogger: the summary table and the plots as images
        table = summary.drop(columns=["per_depth_acceptance"]).astype(object)
        with staged_in_run(logger):
            logger.log_table(key="summary", columns=list(table.columns), data=table.values.tolist())
        logger.log_image(key="plots", images=[str(p) for p in plots])
        if records is not None:
            log_artifact(logger, records, "records", "records")
    logger.save()
    if hasattr(logger, "experiment") and hasattr(logger.experiment, "finish"):
        import wandb

        logger.experiment.finish()
        # finish() only tells wandb-core the run is done (wandb 0.31 publishes inform_finish without waiting); the
        # service closes the run's .wandb log later, so a sync or copy of the run folder right after could read it
        # unflushed (a test here read the header alone, once in four CI runs). teardown waits for the service to exit.
        wandb.teardown()


def log_artifact(logger, path: Path, name: str, kind: str) -> None:
    """A file (records.jsonl, a drafter's .safetensors with its .json) as a versioned W&B artifact of the run."""
    import wandb

    artifact = wandb.Artifact(f"{name}-{logger.experiment.id}", type=kind)
    with staged_in_run(logger):
        for file in [path, path.with_suffix(".json")] if path.suffix == ".safetensors" else [path]:
            if file.exists():
                artifact.add_file(str(file))
        logger.experiment.log_artifact(artifact)


@contextmanager
def staged_in_run(logger):
    """W&B copies the files of an artifact (and of a logged table) to a staging folder that `wandb sync` uploads
    later, by default under ~/.local/share/wandb, outside the run. Staged in the run's own wandb/ folder instead, an
    offline run folder holds all that its sync will upload."""
    old = os.environ.get("WANDB_DATA_DIR")
    os.environ["WANDB_DATA_DIR"] = str(Path(logger.save_dir) / "wandb")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("WANDB_DATA_DIR")
        else:
            os.environ["WANDB_DATA_DIR"] = old
