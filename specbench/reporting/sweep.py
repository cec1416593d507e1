"""A multirun's sweep summary: every job's summary.csv in one table, with the swept settings as columns, and plots
against the first numeric swept setting (one line per method and per value of the other swept settings). Written
automatically at the end of `python run.py -m ...` by a Hydra callback (conf/config.yaml: hydra.callbacks), or with
`python -c "from specbench.reporting.sweep import sweep_summary; sweep_summary('multirun/...')"`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from hydra.experimental.callback import Callback

from specbench.names import current_columns

# plots and paper_table are imported where a multirun ends: Hydra instantiates this callback at the start of every run,
# and their imports (matplotlib, the drafters) would delay even a one-line refusal of a bad setting


def sweep_summary(sweep_dir: str | Path) -> pd.DataFrame | None:
    """sweep_summary.csv and the sweep plots in sweep_dir; None when no job wrote a summary.

    One row per job and method, read from each job folder's summary.csv, so rerunning a sweep into the same
    folder rewrites the table instead of appending to it. A setting from the command line becomes a column unless
    the summary has it already (model, dataset, and method, which is the label there)."""
    sweep_dir = Path(sweep_dir)
    frames, jobs = [], []
    # a job's folder is its number and overrides, so an override holding a path (replay.run=experiments/x,
    # method.checkpoint=artifacts/y) nests it deeper: jobs are found by the .hydra folder Hydra writes into each
    jobs_found = (p.parent.parent for p in sweep_dir.glob("**/.hydra/overrides.yaml") if p.parent.parent != sweep_dir)
    names = sorted((job.relative_to(sweep_dir).as_posix() for job in jobs_found), key=_job_order)
    for name in (name for name in names if (sweep_dir / name / "summary.csv").is_file()):
        overrides = yaml.safe_load((sweep_dir / name / ".hydra" / "overrides.yaml").read_text()) or []
        settings = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith(("hydra.", "experiment=")))
        frame = current_columns(pd.read_csv(sweep_dir / name / "summary.csv"))
        frames.append(frame.assign(job=name, **{k: v for k, v in settings.items() if k not in frame}))
        jobs.append(settings)
    if not frames:
        return None
    table = pd.concat(frames, ignore_index=True)
    table.to_csv(sweep_dir / "sweep_summary.csv", index=False)
    swept = [k for k in dict.fromkeys(k for job in jobs for k in job)
             if len({job.get(k) for job in jobs}) > 1 and k in table and k != "method"]
    numeric = [k for k in swept if pd.to_numeric(table[k], errors="coerce").notna().all()]
    timed = {"speedup", "throughput_speedup"} & set(table)  # a task=replay sweep has tau alone: its table is the result
    if numeric and timed:
        from specbench.reporting.plots import save_sweep_plots

        save_sweep_plots(table, sweep_dir, numeric[0], [k for k in swept if k != numeric[0]])
    return table


def _job_order(name: str) -> tuple[int, str]:
    """Hydra's job number first (sub-folders are named <num>_<overrides>), so job 10 follows job 9."""
    num = name.split("_", 1)[0]
    return (int(num) if num.isdigit() else -1, name)


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        """The sweep's table and plots, and a seed experiment's report (our numbers beside the paper's) from them."""
        if sweep_summary(config.hydra.sweep.dir) is not None and config.get("report"):
            from specbench.reporting.paper_table import report_after_run

            command = " ".join(["python run.py -m", *config.hydra.overrides.task])
            report_after_run(config.report, config.hydra.sweep.dir, command)
