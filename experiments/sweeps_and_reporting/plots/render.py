"""Redraw the standard plots from a shipped summary.csv that has no run folder beside it: each label's settings
(its method and tree budget) are composed from its conf/experiment file, as the run that made it wrote them to
settings.json. Records, the latency profile and memory are drawn where the folder has them.

    python experiments/sweeps_and_reporting/plots/render.py SUMMARY.csv EXPERIMENT OUT_DIR [PROFILE.csv]
"""

import sys
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

from specbench.evaluation.methods import resolve_entries
from specbench.reporting.plots import save_plots

summary_csv, experiment, out = sys.argv[1:4]
with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[3] / "conf"), version_base="1.3"):
    cfg = compose(config_name="config", overrides=[f"experiment={experiment}", "~logger"])
    settings = {"methods": {e.label: e.settings() for e in resolve_entries(cfg)}}
summary = pd.read_csv(summary_csv)
profile = None
if len(sys.argv) > 4:  # task=profile's table: the summary's dtype at the shortest context
    profile = pd.read_csv(sys.argv[4])
    profile = profile[profile["dtype"] == summary["dtype"].iloc[0]]
    profile = profile[profile["context"] == profile["context"].min()]
records = pd.DataFrame(columns=["method", "accept_lengths", "category"])  # the shipped results kept no records
for path in save_plots(records, summary, out, profile, settings):
    print(path)
