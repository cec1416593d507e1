"""task=profile: measure L(n) of the target on this machine next to the chosen hardware's roofline."""

from __future__ import annotations

import pandas as pd

from specbench.hardware.profiler import latency_profile
from specbench.tasks._common import run_dir, setup_target


def run(cfg) -> pd.DataFrame:
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    hw, target = setup_target(cfg)
    profile = latency_profile(target.model, sizes=tuple(cfg.eval.profile_sizes), context=cfg.eval.profile_context,
                              repeats=cfg.eval.profile_repeats, hw=hw)
    profile.to_csv(out / "latency_profile.csv", index=False)
    print(profile.to_string(index=False))
    return profile
