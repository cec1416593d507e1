"""Medusa Table 1 beside ours: acceleration rate (tau), overhead and speedup against the tree budget, from the shipped
summaries (no decoding). python experiments/seed_medusa_table1/render.py  ->  table1.csv, table1.png/.pdf"""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from specbench.reporting.plots import caption, save, style

HERE = Path(__file__).resolve().parent
EXP = HERE.parent
SOURCES = {  # label -> (summary.csv, the command that wrote it)
    "issue9 hardware_aware_budgets": EXP / "issue9_hardware/session3/hardware_aware_budgets_summary.csv",
    "issue4 trained_drafters": EXP / "issue4_trained_drafters/results/session3/mt_bench_bf16_summary.csv",
}
# Medusa Table 1, Medusa-2 on MT-Bench (GPU; tree not stated in the table)
PAPER = {"Vicuna-7B": (3.47, 1.22, 2.83), "Zephyr-7B": (3.14, 1.18, 2.66), "Vicuna-13B": (3.51, 1.23, 2.83),
         "Vicuna-33B": (3.01, 1.27, 2.35)}

rows = []
for source, path in SOURCES.items():
    s = pd.read_csv(path)
    m = s[s["method"].str.fullmatch(r"medusa-\d+")].copy()
    m["budget"] = m["method"].str.split("-").str[1].astype(int)
    m["source"] = source
    m["L(n)/L(1)"] = m["tau"] / m["ideal_speedup"]
    rows.append(m)
ours = pd.concat(rows, ignore_index=True)
cols = ["source", "method", "budget", "tau", "overhead", "L(n)/L(1)", "speedup", "speedup_paired", "speedup_ci_low",
        "speedup_ci_high", "draft_ms_per_step", "verify_ms_per_step", "model", "dtype", "dataset", "num_prompts",
        "cpu_model", "cpu_capability", "threads", "git_commit"]
ours[cols].to_csv(HERE / "table1.csv", index=False, float_format="%.4f")

fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
panels = [("tau", "acceleration rate tau (tokens per target forward)", 0),
          ("overhead", "overhead (mean step time / plain decoding's)", 1),
          ("speedup_paired", "speedup over plain decoding (x), 95% CI", 2)]
for i, (source, grp) in enumerate(ours.groupby("source", sort=False)):
    grp = grp.sort_values("budget")
    x = grp["budget"] * 2 ** (0.04 * (i - 0.5))
    for ax, (col, _, _) in zip(axes, panels):
        if col == "speedup_paired":
            err = [grp[col] - grp["speedup_ci_low"], grp["speedup_ci_high"] - grp[col]]
            ax.errorbar(x, grp[col], yerr=err, capsize=3, label=f"ours, measured ({source})", **style(i))
        else:
            ax.plot(x, grp[col], label=f"ours, measured ({source})", **style(i))
for ax, (_, label, k) in zip(axes, panels):
    for j, (model, vals) in enumerate(PAPER.items()):
        ax.axhline(vals[k], ls=":", lw=1.2, color=style(j + 2)["color"], label=f"paper Table 1: Medusa-2 {model}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks([4, 8, 16, 32], ["4", "8", "16", "32"])
    ax.minorticks_off()
    ax.set_xlabel("tree budget (nodes per verification forward)")
    ax.set_ylabel(label)
axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
fig.suptitle("Medusa Table 1 (acceleration rate, overhead, speedup): ours (Medusa-1, measured) against the paper "
             "(Medusa-2, dotted)", fontsize=10)
fig.text(0.5, 0.0, "ours: " + caption(ours) + " | 64 new tokens, first turns, greedy | earlier session's machine\n"
         "paper: Medusa-2 on Vicuna-7B/13B/33B and Zephyr-7B, fp16 GPU (speed GPU not stated; A100 used for "
         "training), MT-Bench 80 questions", ha="center", va="top", fontsize=7, color="dimgray")
fig.tight_layout()
print(save(fig, HERE / "table1")[0])
print(ours[["source", "method", "tau", "overhead", "L(n)/L(1)", "speedup", "speedup_paired"]].to_string(index=False))
