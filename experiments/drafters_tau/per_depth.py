"""Per-depth acceptance of each drafter replayed on this experiment's answers: per_depth.csv and plots/per_depth.png.

    python experiments/drafters_tau/per_depth.py [BUDGET]      (default 8; under the CPU lock, about a minute)

Each drafter is composed as `python run.py experiment=drafters/tau method=... store=...` composes it for task=replay,
and replayed (specbench.evaluation.replay) on every answer of each set. Acceptance at depth d is the share of steps
that accepted at least d drafted tokens among those that accepted d - 1 (every step reaches depth 1), so a curve shows
where along its tree a drafter stops being right; tau is 1 + the sum over depths of the unconditional shares.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib
import pandas as pd
from hydra import compose, initialize_config_dir

from specbench.config import CONF_DIR, build
from specbench.evaluation.methods import build_drafter
from specbench.evaluation.metrics import decode_tau
from specbench.evaluation.replay import replay_answers
from specbench.evaluation.run_folder import RECORDS_FILE, read_records
from specbench.tasks._common import build_model

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
SETS = {"mt_bench": "MT-Bench", "humaneval": "HumanEval", "summarization": "summarization"}
DRAFTERS = {  # label: overrides of experiment=drafters/tau
    "SSSD, ShareGPT datastore": ["method=sssd", "store=sharegpt"],
    "SSSD, ShareGPT of equal size": ["method=sssd", "store=sharegpt_equal"],
    "SSSD, self-distilled": ["method=sssd", "store=self_distilled"],
    "PLD": ["method=pld"],
    "suffix": ["method=suffix"],
    "hybrid (SSSD self-distilled + suffix)": ["method=hybrid", "store=self_distilled"],
}


def accept_lengths(overrides: list[str], dataset: str, budget: int) -> tuple[list[int], int]:
    """(drafted tokens accepted per step, new tokens) of the drafter replayed on the set's answers, in their order."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=drafters/tau", f"dataset={dataset}",
                                                       f"tree.budget={budget}", *overrides])
    target = build_model(cfg.model, dtype="float32")
    drafter = build_drafter(cfg.method.drafter, target, build(cfg.tree))
    prompts = {p.question_id: p for p in build(cfg.dataset, num_prompts=None)}
    lengths, new_tokens = [], 0
    answers = [r for r in read_records(HERE / "answers" / dataset / RECORDS_FILE)
               if r["method"] == "plain" and r["turn"] == 0]
    for record, out in replay_answers(drafter, answers, prompts, target.tokenizer, target.chat_template,
                                      target.max_context):
        lengths += [n - 1 for n in out.accept_lengths]
        new_tokens += len(record["output_ids"])
    return lengths, new_tokens


def main(budget: int) -> None:
    rows = []
    for dataset in SETS:
        for label, overrides in DRAFTERS.items():
            lengths, new_tokens = accept_lengths(overrides, dataset, budget)
            tau = decode_tau(pd.Series([new_tokens]), len(lengths))
            reached = len(lengths)
            for depth in range(1, budget):
                accepted = sum(n >= depth for n in lengths)
                rows.append({"dataset": dataset, "drafter": label, "budget": budget, "depth": depth, "tau": tau,
                             "reached": reached, "accepted": accepted,
                             "acceptance": accepted / reached if reached else float("nan")})
                reached = accepted
            print(f"{dataset:14s} {label:40s} tau {tau:.3f}")
    table = pd.DataFrame(rows)
    table.to_csv(HERE / f"per_depth_{budget}.csv", index=False)
    fig, axes = plt.subplots(1, len(SETS), figsize=(5 * len(SETS), 4.2), sharey=True)
    for ax, (dataset, name) in zip(axes, SETS.items()):
        for label, part in table[table.dataset == dataset].groupby("drafter", sort=False):
            ax.plot(part.depth, part.acceptance, marker="o", label=f"{label} (tau {part.tau.iloc[0]:.2f})")
        ax.set_title(name)
        ax.set_xlabel("draft depth (tokens below the root)")
        ax.set_xticks(range(1, budget))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("acceptance given the parent accepted (fraction of steps)")
    cpus = sorted({cpu for dataset in SETS for cpu in re.findall(r'"cpu_model": "([^"]*)"',
                                                                  (HERE / "answers" / dataset / RECORDS_FILE).read_text())})
    fig.suptitle(f"Per-depth acceptance at {budget} nodes, replayed on greedy answers: SmolLM2-135M, eager float32 on "
                 f"{', '.join(cpus)}, 20 prompts x 128 tokens per set")
    fig.tight_layout()
    (HERE / "plots").mkdir(exist_ok=True)
    fig.savefig(HERE / "plots" / f"per_depth_{budget}.png", dpi=110)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
