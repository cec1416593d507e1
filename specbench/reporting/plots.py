"""The standard plots of a run, drawn with matplotlib from the records and summary tables.

Every plot carries a title and a caption line with the model, hw, dtype, dataset and prompt count (read from the
summary's provenance columns), so a PNG found on its own still says what it shows.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs are headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def caption(summary: pd.DataFrame) -> str:
    def one(key):
        return ", ".join(str(v) for v in dict.fromkeys(summary[key])) if key in summary else "?"
    return (f"{one('model')} | hw {one('hw')} | {one('dtype')} | {one('dataset')} | "
            f"{int(summary['num_prompts'].max())} prompts | {one('cpu_capability')}")


def save_plots(records: pd.DataFrame, summary: pd.DataFrame, out_dir: str | Path,
               latency_profile: pd.DataFrame | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    note = caption(summary)
    paths = [_speed(summary, out / "speed.png", note), _accept_hist(records, out / "accept_lengths.png", note),
             _per_depth(summary, out / "per_depth_acceptance.png", note)]
    if latency_profile is not None and not latency_profile.empty:
        paths.append(_latency(latency_profile, out / "latency_profile.png", note))
    if "alpha_history" in records and records["alpha_history"].notna().any():
        paths.append(_alpha(records, out / "alpha.png", note))
    return paths


def _speed(summary: pd.DataFrame, path: Path, note: str) -> Path:
    """Paired speedup with its 95% interval (the baseline's bar is 1 by definition), and tau."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(9, 0.7 * len(summary) + 4), 4))
    x = np.arange(len(summary))
    mean = summary["speedup_paired"].to_numpy(dtype=float)
    err = np.vstack([mean - summary["speedup_ci_low"], summary["speedup_ci_high"] - mean]).clip(min=0)
    ax1.bar(x, mean, yerr=np.nan_to_num(err), capsize=3, color="tab:blue")
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_ylabel("speedup over plain decoding (x)\nmean of per-prompt ratios, 95% CI")
    ax2.bar(x, summary["tau"], color="tab:green")
    ax2.set_ylabel("tau (tokens per target forward)")
    for ax in (ax1, ax2):
        ax.set_xticks(x, summary["method"], rotation=35, ha="right", fontsize=8)
    return _save(fig, path, "Speed and acceptance per method", note)


def _accept_hist(records: pd.DataFrame, path: Path, note: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, grp in records.groupby("method", sort=False):
        lengths = np.concatenate([np.asarray(a) for a in grp["accept_lengths"]])
        if lengths.size:
            ax.hist(lengths, bins=np.arange(1, lengths.max() + 2) - 0.5, alpha=0.5, label=method, density=True)
    ax.set_xlabel("tokens gained per step (bonus included)")
    ax.set_ylabel("share of steps")
    return _save(fig, path, "Tokens per verification step", note, ax)


def _per_depth(summary: pd.DataFrame, path: Path, note: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for _, row in summary.iterrows():
        rates = row["per_depth_acceptance"]
        if len(rates):
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=row["method"])
    ax.set_xlabel("draft depth d")
    ax.set_ylabel("P(depth d accepted | d-1 accepted, it had children)")
    ax.set_ylim(0, 1)
    return _save(fig, path, "Acceptance by depth", note, ax)


def _latency(profile: pd.DataFrame, path: Path, note: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(profile["tokens"], profile["ms"], marker="o", label="measured L(n)")
    if "roofline_ms" in profile:
        ax.plot(profile["tokens"], profile["roofline_ms"], linestyle="--", label="roofline of hw")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in one forward (n)")
    ax.set_ylabel("latency of one forward (ms)")
    return _save(fig, path, "Forward latency against its roofline", note, ax)


def _alpha(records: pd.DataFrame, path: Path, note: str) -> Path:
    """LLMCad's verification threshold over one generation per method: the first prompt's."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, grp in records[records["alpha_history"].notna()].groupby("method", sort=False):
        alpha = grp["alpha_history"].iloc[0]
        ax.step(range(1, len(alpha) + 1), alpha, where="post", label=f"{method} ({grp['question_id'].iloc[0]})")
    ax.set_yscale("log")
    ax.set_xlabel("verification step")
    ax.set_ylabel("alpha (log scale)")
    ax.set_title("drafting stops once the best branch's confidence falls below alpha", fontsize=8)
    return _save(fig, path, "LLMCad's adaptive verification threshold over one generation", note, ax)


def _save(fig, path: Path, title: str, note: str, legend_ax=None) -> Path:
    if legend_ax is not None and legend_ax.get_legend_handles_labels()[0]:
        legend_ax.legend(fontsize=7)
    fig.suptitle(f"{title}\n{note}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
