"""A multirun's sweep summary: every job's summary.csv in one table, with the swept settings as columns, and a plot
of the headline metrics against the first numeric swept setting (one line per method). Written automatically at
the end of `python run.py -m ...` by a Hydra callback (conf/config.yaml: hydra.callbacks), or on demand with
`python -c "from specbench.reporting.sweep import sweep_summary; sweep_summary('multirun/...')"`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from hydra.experimental.callback import Callback

from specbench.reporting.plots import caption, plt

METRICS = (("throughput_tokens_per_s", "throughput (tokens/s, all sequences)"),
           ("throughput_speedup", "throughput over plain decoding's (x)"),
           ("tokens_per_s", "per-sequence tokens/s (latency)"), ("tau", "tau (tokens per target forward)"))


def sweep_summary(sweep_dir: str | Path) -> pd.DataFrame | None:
    """sweep_summary.csv and sweep_<metric>.png in sweep_dir; None when no job wrote a summary."""
    sweep_dir = Path(sweep_dir)
    frames = []
    for summary in sorted(sweep_dir.glob("*/summary.csv")):
        overrides = yaml.safe_load((summary.parent / ".hydra" / "overrides.yaml").read_text()) or []
        swept = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith(("hydra.", "experiment=")))
        frames.append(pd.read_csv(summary).assign(job=summary.parent.name, **swept))
    if not frames:
        return None
    table = pd.concat(frames, ignore_index=True)
    table.to_csv(sweep_dir / "sweep_summary.csv", index=False)
    keys = [k for k in frames[0].columns if k not in pd.read_csv(next(sweep_dir.glob("*/summary.csv"))).columns
            and k != "job"]
    numeric = [k for k in keys if pd.to_numeric(table[k], errors="coerce").notna().all()]
    if numeric:
        _plot(table, numeric[0], sweep_dir)
    return table


def _plot(table: pd.DataFrame, key: str, out: Path) -> None:
    table = table.assign(**{key: pd.to_numeric(table[key])}).sort_values(key)
    metrics = [(m, label) for m, label in METRICS if m in table]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 4))
    for ax, (metric, label) in zip(axes, metrics):
        for method, grp in table.groupby("method", sort=False):
            ax.plot(grp[key], grp[metric], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(key)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Sweep over {key}\n{caption(table)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=110)
    plt.close(fig)


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_summary(config.hydra.sweep.dir)
