"""task=calibrate: per-depth, per-rank acceptance probabilities of the method's drafter on the dataset, saved as
the JSON that tree=greedy reads (`+calibration.out=FILE`, `+calibration.depth=5`, `+calibration.ranks=8`)."""

from specbench.trees.calibration import run

__all__ = ["run"]
