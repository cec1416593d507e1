"""Ghidorah's width sweep: the projection on `jetson` (task=hardware, roofline model) beside the paper's Fig. 9 and
Table I, and the width sweep measured on a CPU (Medusa-1 at tree budgets 4..32, hardware_aware_budgets).
python experiments/seed_ghidorah_width/render.py  ->  widths.csv, widths.png/.pdf"""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from specbench.reporting.plots import caption, save, style

HERE = Path(__file__).resolve().parent
SWEEP = HERE / "projected_jetson/ghidorah_sweep.csv"
MEASURED = HERE.parent / "issue9_hardware/session3/hardware_aware_budgets_summary.csv"
W = [1, 2, 4, 8, 16, 32, 64]
# Ghidorah Table I (reconstructed, notes A6): acceptance length vs width
TABLE_I = {"MT-bench": [1, 1.72, 2.28, 2.59, 2.93, 3.19, 3.34], "MBPP": [1, 1.78, 2.54, 2.89, 3.27, 3.55, 3.74]}
# Ghidorah Fig. 9, MBPP, normalised speed (Sequential = 1), read off the figure: APPROXIMATE
FIG9 = {"Medusa (GPU only)": [2.5, 2.9, 3.2, 3.5, 3.6], "Medusa+EM (megatron)": [4.6, 5.2, 5.8, 6.0, 4.9],
        "Ghidorah (hcmp)": [5.9, 6.5, 7.2, 6.2, 5.7]}
NAMES = {"gpu_only": "Medusa (GPU only)", "megatron": "Medusa+EM (megatron)", "hcmp": "Ghidorah (hcmp)"}

sweep = pd.read_csv(SWEEP)
seq = sweep[(sweep["partition"] == "gpu_only") & (sweep["width"] == 1)]["tokens_per_s"].iloc[0]
sweep["normalised_speed"] = sweep["tokens_per_s"] / seq
s = pd.read_csv(MEASURED)
meas = s[s["method"].str.fullmatch(r"medusa-\d+")].copy()
meas["width"] = meas["method"].str.split("-").str[1].astype(int)
meas = meas.sort_values("width")
table = pd.concat([
    sweep.assign(kind="PROJECTED (roofline, jetson)")[["kind", "partition", "width", "cpu_ratio", "tau", "step_ms",
                                                       "tokens_per_s", "normalised_speed"]],
    meas.assign(kind="MEASURED (cpu, SmolLM2-135M)", partition="medusa")[
        ["kind", "partition", "width", "tau", "tokens_per_s", "speedup", "speedup_paired", "speedup_ci_low",
         "speedup_ci_high", "overhead", "cpu_capability", "dtype", "git_commit"]]], ignore_index=True)
table.to_csv(HERE / "widths.csv", index=False, float_format="%.4f")

fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
ax = axes[0]
for i, (part, grp) in enumerate(sweep.groupby("partition", sort=False)):
    ax.plot(grp["width"], grp["normalised_speed"], label=f"projected: {NAMES[part]}", **style(i))
    ax.plot([4, 8, 16, 32, 64], FIG9[NAMES[part]], ls=":", marker=style(i)["marker"], markerfacecolor="none",
            color=style(i)["color"], label=f"paper Fig. 9 (approx.): {NAMES[part]}")
ax.set_ylabel("decoding speed over sequential (x)")
ax.set_title("Jetson Xavier NX, Vicuna-7B shape fp16, MBPP tau", fontsize=8)
ax = axes[1]
for j, (name, taus) in enumerate(TABLE_I.items()):
    ax.plot(W, taus, ls=":", marker="*", markerfacecolor="none", color=style(j + 3)["color"],
            label=f"paper Table I: {name} (Vicuna-7B + Medusa)")
ax.plot(meas["width"], meas["tau"], label="ours, measured: MT-Bench (SmolLM2-135M + Medusa-1)", **style(5))
ax.set_ylabel("acceptance length tau (tokens per target forward)")
ax.set_title("tau(W): device-independent", fontsize=8)
ax = axes[2]
err = [meas["speedup_paired"] - meas["speedup_ci_low"], meas["speedup_ci_high"] - meas["speedup_paired"]]
ax.errorbar(meas["width"], meas["speedup_paired"], yerr=err, capsize=3,
            label="ours, measured: Medusa-1 on the CPU (GPU-only analogue)", **style(5))
ax.set_ylabel("speedup over plain decoding (x), 95% CI")
ax.set_title("measured width sweep on a 2-thread CPU (no CPU+GPU split here)", fontsize=8)
for ax in axes:
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(W, [str(w) for w in W])
    ax.minorticks_off()
    ax.set_xlabel("verification width W (tokens per forward)")
    ax.legend(fontsize=6.5, loc="best")
fig.suptitle("Ghidorah's width sweep: projected on jetson (left), tau(W) against Table I (middle), measured on a CPU "
             "(right)", fontsize=10)
fig.text(0.5, 0.0, "projected: llama2_7b shape, float16, + 4 Medusa heads | hw jetson (conf/hw/jetson.yaml, "
         "roofline + ARCA grid search) | context 256 | tau(W) = Table I MBPP | no prompts decoded\nmeasured: "
         + caption(meas) + " | 64 new tokens, first turns | earlier session's machine\npaper: Ghidorah, Vicuna-7B + "
         "Medusa heads, Jetson Xavier NX (GPU at 204 MHz + CPU), context ~256", ha="center", va="top", fontsize=7,
         color="dimgray")
fig.tight_layout()
print(save(fig, HERE / "widths")[0])
print(table.to_string(index=False))
