"""PPD against Medusa at equal tree sizes: ours (measured, issue 4's interleaved run) beside the PPD thesis's Table 6.1
points. python experiments/seed_ppd_vs_medusa/render.py  ->  ppd_vs_medusa.csv, ppd_vs_medusa.png/.pdf"""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from specbench.reporting.plots import caption, save, style

HERE = Path(__file__).resolve().parent
SUMMARY = HERE.parent / "issue4_trained_drafters/results/session3/mt_bench_bf16_summary.csv"
# PPD thesis Table 6.1 (MT-Bench, A100-40GB, non-greedy): rows per forward (Medusa's 63-node tree; PPD's S_input of
# its steady states), tau, speedup = T / T_vanilla
PAPER = [("Vicuna-7B", "medusa", 63, 2.51, 82.0 / 39.2), ("Vicuna-7B", "ppd", 105, 2.54, 88.0 / 39.2),
         ("Vicuna-13B", "medusa", 63, 2.59, 63.4 / 30.4), ("Vicuna-13B", "ppd", 60, 2.44, 66.1 / 30.4)]

s = pd.read_csv(SUMMARY)
ours = s[s["method"].str.fullmatch(r"(medusa|ppd)-\d+")].copy()
ours["family"] = ours["method"].str.split("-").str[0]
ours["budget"] = ours["method"].str.split("-").str[1].astype(int)
cols = ["method", "budget", "mean_tree_size", "tau", "overhead", "speedup", "speedup_paired", "speedup_ci_low",
        "speedup_ci_high", "draft_ms_per_step", "verify_ms_per_step", "method_mem_mb", "model", "dtype", "dataset",
        "num_prompts", "cpu_model", "cpu_capability", "threads", "git_commit"]
ours[cols].to_csv(HERE / "ppd_vs_medusa.csv", index=False, float_format="%.4f")

fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
for i, (fam, grp) in enumerate(ours.groupby("family", sort=False)):
    grp = grp.sort_values("budget")
    axes[0].plot(grp["mean_tree_size"], grp["tau"], label=f"ours {fam}, measured (SmolLM2-135M)", **style(i))
    err = [grp["speedup_paired"] - grp["speedup_ci_low"], grp["speedup_ci_high"] - grp["speedup_paired"]]
    axes[1].errorbar(grp["mean_tree_size"] * 2 ** (0.04 * (i - 0.5)), grp["speedup_paired"], yerr=err, capsize=3,
                     label=f"ours {fam}, measured (SmolLM2-135M)", **style(i))
for model, fam, rows, tau, sp in PAPER:
    i = 0 if fam == "medusa" else 1
    kw = dict(color=style(i)["color"], marker="*" if model == "Vicuna-7B" else "h", markersize=11,
              markerfacecolor="none", ls="none", label=f"paper {fam}, {model} (Table 6.1)")
    axes[0].plot(rows, tau, **kw)
    axes[1].plot(rows, sp, **kw)
for ax, label in zip(axes, ["tau (tokens per target forward)", "speedup over plain decoding (x); ours: 95% CI"]):
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks([8, 16, 32, 64, 128], ["8", "16", "32", "64", "128"])
    ax.minorticks_off()
    ax.set_xlabel("rows per verification forward (PPD: prompt tokens included)")
    ax.set_ylabel(label)
axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
fig.suptitle("PPD against Medusa at equal tree sizes (budgets 8/16/32): ours measured, the thesis's points hollow",
             fontsize=10)
fig.text(0.5, 0.0, "ours: " + caption(ours) + " | 64 new tokens, first turns, greedy exact | earlier session's "
         "machine\npaper: PPD thesis Table 6.1, Vicuna-7B/13B v1.3, fp16, A100-40GB, MT-Bench, non-greedy "
         "(default temperatures)", ha="center", va="top", fontsize=7, color="dimgray")
fig.tight_layout()
print(save(fig, HERE / "ppd_vs_medusa")[0])
print(ours[["method", "mean_tree_size", "tau", "overhead", "speedup", "speedup_paired", "speedup_ci_low",
            "speedup_ci_high", "draft_ms_per_step", "method_mem_mb"]].to_string(index=False))
