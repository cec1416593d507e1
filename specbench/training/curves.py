"""A Lightning callback that redraws the training curve (reporting/training_curves.py) into the run folder after
every validation, the last one being the final weights', so a run stopped in the middle still has its plot.

A resumed fit starts a fresh metrics.csv (Lightning's CSVLogger deletes the old one), so the callback keeps the
whole history beside the plot (stem.csv): the rows of earlier fits before this fit's first step, then this fit's."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pandas as pd
from lightning.pytorch.loggers import CSVLogger

from specbench.reporting.plots import save
from specbench.reporting.training_curves import training_curve_figure


class TrainingCurves(L.Callback):
    """stem.png/.pdf and stem.csv from the CSVLogger's metrics.csv (other loggers keep their own curves)."""

    def __init__(self, stem: Path, title: str, caption: str) -> None:
        self.stem, self.title, self.caption = Path(stem), title, caption
        self.earlier: pd.DataFrame | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        history = self.stem.with_suffix(".csv")
        self.earlier = pd.read_csv(history) if history.exists() else None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._history(trainer)  # what a fit resumed from this checkpoint keeps

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = None if trainer.sanity_checking else self._history(trainer)
        if metrics is not None:
            save(training_curve_figure(metrics, self.title, self.caption), self.stem)

    def _history(self, trainer: L.Trainer) -> pd.DataFrame | None:
        """Earlier fits' rows and this fit's, written to stem.csv (rank 0, CSV logger only)."""
        logger = trainer.logger
        if not trainer.is_global_zero or not isinstance(logger, CSVLogger):
            return None
        logger.save()
        path = Path(logger.experiment.metrics_file_path)
        if not path.exists():
            return None
        metrics = pd.read_csv(path)
        if self.earlier is not None and len(metrics):
            metrics = pd.concat([self.earlier[self.earlier["step"] < metrics["step"].min()], metrics])
        self.stem.parent.mkdir(parents=True, exist_ok=True)
        metrics.to_csv(self.stem.with_suffix(".csv"), index=False)
        return metrics
