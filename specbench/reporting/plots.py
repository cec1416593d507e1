"""The standard plots of a run, drawn with matplotlib from the records and summary tables."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs are headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def save_plots(records: pd.DataFrame, summary: pd.DataFrame, out_dir: str | Path,
               latency_profile: pd.DataFrame | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [_speed(summary, out / "speed.png"), _accept_hist(records, out / "accept_lengths.png"),
             _per_depth(summary, out / "per_depth_acceptance.png")]
    if latency_profile is not None and not latency_profile.empty:
        paths.append(_latency(latency_profile, out / "latency_profile.png"))
    return paths


def _speed(summary: pd.DataFrame, path: Path) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.bar(summary["method"], summary["tokens_per_s"], color="tab:blue")
    ax1.set_ylabel("tokens/s (prefill included)")
    for i, s in enumerate(summary["speedup"]):
        ax1.annotate(f"{s:.2f}x", (i, summary["tokens_per_s"].iloc[i]), ha="center", va="bottom")
    ax2.bar(summary["method"], summary["tau"], color="tab:green")
    ax2.set_ylabel("tau (mean accepted length)")
    return _save(fig, path)


def _accept_hist(records: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, grp in records.groupby("method", sort=False):
        lengths = np.concatenate([np.asarray(a) for a in grp["accept_lengths"]])
        if lengths.size:
            ax.hist(lengths, bins=np.arange(1, lengths.max() + 2) - 0.5, alpha=0.6, label=method, density=True)
    ax.set_xlabel("tokens per step (bonus included)")
    ax.set_ylabel("share of steps")
    return _save(fig, path, ax)


def _per_depth(summary: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for _, row in summary.iterrows():
        rates = row["per_depth_acceptance"]
        if len(rates):
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=row["method"])
    ax.set_xlabel("depth d")
    ax.set_ylabel("P(accept d | accept d-1)")
    ax.set_ylim(0, 1)
    return _save(fig, path, ax)


def _latency(profile: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(profile["tokens"], profile["ms"], marker="o", label="measured")
    if "roofline_ms" in profile:
        ax.plot(profile["tokens"], profile["roofline_ms"], linestyle="--", label="roofline")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in one forward")
    ax.set_ylabel("ms")
    return _save(fig, path, ax)


def _save(fig, path: Path, legend_ax=None) -> Path:
    if legend_ax is not None:
        legend_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
