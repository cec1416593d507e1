"""An offline W&B run folder holds what its sync will upload: the records artifact is staged inside it."""

import os

import pandas as pd
from lightning.pytorch.loggers import WandbLogger
from omegaconf import OmegaConf

from specbench.reporting.loggers import SCALARS, log_run
from specbench.reporting.plots import plt, save


def test_an_offline_run_stages_its_artifacts_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_DATA_DIR", raising=False)
    records = tmp_path / "records.jsonl"
    records.write_text('{"method": "pld", "question_id": "81"}\n')
    fig, _ = plt.subplots()
    png, _ = save(fig, tmp_path / "plots" / "speed")
    summary = pd.DataFrame({"method": ["pld"], **{k: [1.5] for k in SCALARS}, "per_depth_acceptance": [[0.5]]})
    logger = WandbLogger(save_dir=str(tmp_path), project="specbench", offline=True)
    log_run(logger, OmegaConf.create({"task": "eval"}), summary, [png], records)
    staged = [p.read_text() for p in (tmp_path / "wandb" / "artifacts" / "staging").iterdir()]
    assert records.read_text() in staged
    assert "WANDB_DATA_DIR" not in os.environ  # the process's own setting is left as it was
    run = next((tmp_path / "wandb").glob("offline-run-*"))
    assert b"records-" in next(run.glob("run-*.wandb")).read_bytes()
    assert list((run / "files" / "media" / "images").glob("plots_*.png"))
