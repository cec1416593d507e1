"""SSSD's batch sweep: ours (measured, b = 1..16, issue 11) beside the ranges the SSSD paper states in its Fig. 6 text.
python experiments/seed_sssd_batch/render.py  ->  batch.csv, batch.png/.pdf"""

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from specbench.reporting.plots import caption, save, style

HERE = Path(__file__).resolve().parent
SWEEP = HERE.parent / "issue11_sssd/batch/sweep_summary.csv"
# SSSD paper (arXiv 2411.05894), Llama2-7b chat on one Ascend 910B4, vLLM-based continuous batching; ranges across its
# three context-length subsets (Fig. 6 text): speedup 2.05-2.61x at b = 1, 1.37-1.80x at b = 64
PAPER = {1: (2.05, 2.61), 64: (1.37, 1.80)}

s = pd.read_csv(SWEEP).rename(columns={"eval.batch_size": "batch_size"})
cols = ["batch_size", "method", "tau", "mean_tree_size", "throughput_tokens_per_s", "throughput_speedup",
        "tokens_per_s", "speedup_paired", "verify_ms_per_step", "model", "dtype", "dataset", "num_prompts",
        "cpu_model", "cpu_capability", "threads", "git_commit"]
s[cols].to_csv(HERE / "batch.csv", index=False, float_format="%.4f")

fig, ax = plt.subplots(figsize=(8, 4.4))
for i, (m, grp) in enumerate(s[s["method"] != "autoregressive"].groupby("method", sort=False)):
    ax.plot(grp["batch_size"], grp["throughput_speedup"], label=f"ours {m}, measured (SmolLM2-135M, CPU)", **style(i))
for b, (lo, hi) in PAPER.items():
    ax.vlines(b, lo, hi, color=style(1)["color"], lw=6, alpha=0.35,
              label="paper SSSD range (Llama2-7b, Ascend 910B4)" if b == 1 else None)
ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="plain decoding at the same batch size")
ax.set_xscale("log", base=2)
ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
ax.minorticks_off()
ax.set_xlabel("batch size b (sequences per verification forward)")
ax.set_ylabel("throughput over plain decoding's (x)")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
fig.suptitle("SSSD's batch sweep: where speculation stops paying", fontsize=10)
fig.text(0.5, 0.0, "ours: " + caption(s) + " | 64 new tokens, first turns, SSSD 32 rows, PLD <= 11 | earlier "
         "session's machine\npaper: SSSD Fig. 6 (text), Llama2-7b chat fp16, 1x Ascend 910B4 + 64-core EPYC host, "
         "100 prompts per subset, contexts 46/1800/3400, s_q <= 30", ha="center", va="top", fontsize=7,
         color="dimgray")
fig.tight_layout()
print(save(fig, HERE / "batch")[0])
