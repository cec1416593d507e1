"""The training curve of a drafter (task=train): loss, held-out per-position top-1 accuracy and tau_sim over the
optimizer steps, drawn from a Lightning CSVLogger's metrics.csv.

Per-position columns are EAGLE's val/pos{k}_top1 (depth k given depth k-1 was accepted) or Medusa's val/head{k}_top1
(head k alone); tau_sim is EAGLE's expected chain length from those accuracies.
"""

from __future__ import annotations

import re

import pandas as pd
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from specbench.reporting.plots import style

POSITION = re.compile(r"val/(pos|head)(\d+)_top1$")


def training_curve_figure(metrics: pd.DataFrame, title: str, caption: str) -> Figure:
    """metrics: metrics.csv's rows (columns step, epoch and the logged keys; each row holds the keys logged then)."""
    positions = sorted((c for c in metrics if POSITION.match(c)), key=lambda c: int(POSITION.match(c)[2]))
    panels = ["loss", "accuracy"] + (["tau"] if "val/tau_sim" in metrics else [])
    # one step axis for all panels: held-out rows logged once an epoch would otherwise get an axis of their own
    # spanning a single step
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), sharex=True)
    ax = axes[0]
    train = metrics.dropna(subset=["train/loss"]) if "train/loss" in metrics else metrics.iloc[:0]
    if len(train):
        ax.plot(train["step"], train["train/loss"], color="lightgray", lw=0.8, label="train (logged batches)")
        smooth = train["train/loss"].rolling(max(1, len(train) // 25), min_periods=1).mean()
        ax.plot(train["step"], smooth, color="black", lw=1.4, label="train, running mean")
    val = metrics.dropna(subset=["val/loss"]) if "val/loss" in metrics else metrics.iloc[:0]
    if len(val):
        ax.plot(val["step"], val["val/loss"], "o-", color="tab:red", ms=4, label="held-out")
    ax.set(xlabel="optimizer step", ylabel="loss (weighted sum over positions, nats)", title="loss")
    ax.legend(fontsize=7)
    ax = axes[1]
    for i, col in enumerate(positions):
        rows = metrics.dropna(subset=[col])
        kind, k = POSITION.match(col).groups()
        label = f"depth {k} (given depth {int(k) - 1} accepted)" if kind == "pos" and k != "1" else \
            (f"depth {k}" if kind == "pos" else f"head {k}")
        ax.plot(rows["step"], rows[col], lw=1.4, ms=4, label=label, **style(i))
    ax.set(xlabel="optimizer step", ylabel="held-out top-1 accuracy", title="per-position top-1 (held-out)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    if "tau" in panels:
        ax = axes[2]
        rows = metrics.dropna(subset=["val/tau_sim"])
        ax.plot(rows["step"], rows["val/tau_sim"], "o-", color="tab:green", ms=4)
        ax.set(xlabel="optimizer step", ylabel="tau_sim (tokens per target forward)",
               title="expected accepted length of a chain")
    for ax in axes:
        ax.grid(alpha=0.3)
        for step in _epoch_starts(metrics)[1:]:
            ax.axvline(step, color="gray", ls=":", lw=0.8)
    fig.suptitle(title + " (dotted lines: epochs)", fontsize=10)
    fig.text(0.5, 0.0, caption, ha="center", va="top", fontsize=7, color="dimgray")
    fig.tight_layout()
    return fig


def _epoch_starts(metrics: pd.DataFrame) -> list[int]:
    if "epoch" not in metrics:
        return []
    rows = metrics.dropna(subset=["epoch"])
    return rows.groupby("epoch")["step"].min().sort_values().tolist()
