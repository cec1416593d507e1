"""Issue 3, must-show 2: the greedy expected-length tree builder.

A. Medusa's Vicuna-7B head accuracies: the greedy 64-node tree vs every Cartesian tree of 64 nodes (and vs Medusa's
   own mc_sim_7b_63), by expected tau.
B. SmolLM2-135M with an early-exit draft (first N layers) or a distilled one (--checkpoint): calibrate on MT-Bench prompts from 20 on, build greedy
   trees with budgets 4..64, and compare the measured tau on prompts from 0 on (disjoint; greedy, exact acceptance,
   bf16) with the builder's expected tau.

    python experiments/issue3_draft_trees/tree_builder.py [--layers 8 | --checkpoint ARTIFACT] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from common import (
    add_draft_args,
    draft_source,
    mt_bench_ids,
    now,
    run,
    set_threads,
    smollm2,
)

from specbench.acceptance import ExactAcceptance, SamplingParams
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.evaluation.calibration import calibrate, probe_tree
from specbench.trees.greedy import (
    GreedyPolicy,
    expected_tau,
    greedy_choices,
    load_accept_prob,
)
from specbench.trees.static import cartesian_choices, load_preset

HERE = Path(__file__).resolve().parent


def part_a() -> dict:
    table = load_accept_prob("medusa_vicuna_7b_accuracies")
    _, greedy_tau = greedy_choices(table, 64)
    shapes = [list(w) for d in range(1, 6) for w in itertools.product(range(1, 6), repeat=d)
              if len(cartesian_choices(list(w))) == 63]
    cartesian = sorted(((expected_tau(cartesian_choices(w), table), w) for w in shapes), reverse=True)
    mc_sim = expected_tau(load_preset("mc_sim_7b_63"), table)
    print("A. Medusa Vicuna-7B head accuracies, 64-node trees (root included), expected tau:")
    print(f"   greedy builder: {greedy_tau:.3f}")
    print(f"   mc_sim_7b_63 (Medusa's tree, top-10 ranks; ranks > 5 count 0 here): {mc_sim:.3f}")
    for tau, widths in cartesian:
        print(f"   Cartesian {widths}: {tau:.3f}")
    return {"greedy_64": greedy_tau, "mc_sim_7b_63": mc_sim, "cartesian": [[w, t] for t, w in cartesian]}


def part_b(draft: dict, label: str, max_new_tokens: int, budgets: list[int], calib: int, evals: int,
           calibration_file: str | None) -> dict:
    set_threads()
    target = smollm2("bfloat16")
    eval_prompts = mt_bench_ids(target.tokenizer, 0, evals)
    if calibration_file:  # reuse a saved calibration
        path = Path(calibration_file)
        accept_prob = json.loads(path.read_text())["accept_prob"]
    else:
        depth, ranks = 6, 6
        calib_prompts = mt_bench_ids(target.tokenizer, 20, calib)
        print(f"[{now()}] calibrating {label} on {calib} prompts", flush=True)
        drafter = DraftModelDrafter(target, probe_tree(depth, ranks), **draft)
        calibration = calibrate(target.model, drafter, calib_prompts, depth, ranks, max_new_tokens,
                                target.eos_token_ids)
        path = calibration.save(HERE / f"calibration_smollm2_{label}.json", drafter=label, model="smollm2_135m",
                                dataset=f"mt_bench[20:{20 + calib}]", max_new_tokens=max_new_tokens)
        accept_prob = calibration.accept_prob
    for level, row in enumerate(accept_prob, 1):
        print(f"   depth {level}: " + " ".join(f"{a:.3f}" for a in row))
    rows = []
    print(f"\nB. SmolLM2-135M, draft {label}, greedy trees, MT-Bench prompts 0-{evals - 1}, "
          f"{max_new_tokens} new tokens, bf16")
    print("| budget n | expected tau | measured tau | tokens/s |")
    print("|---|---|---|---|")
    for n in budgets:
        policy = GreedyPolicy(n=n, accept_prob=str(path))
        result = run(target, DraftModelDrafter(target, policy, **draft), ExactAcceptance(),
                     SamplingParams(), eval_prompts, max_new_tokens)
        rows.append({"n": n, "expected_tau": policy.expected_tau, "measured_tau": result.tau,
                     "tokens_per_s": result.tokens_per_s, "depth": policy.depth})
        print(f"| {n} | {policy.expected_tau:.2f} | {result.tau:.2f} | {result.tokens_per_s:.1f} |", flush=True)
    return {"draft": label, "calibration": str(path.name), "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_draft_args(parser, 8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--calib-prompts", type=int, default=10)
    parser.add_argument("--eval-prompts", type=int, default=10)
    parser.add_argument("--calibration", help="a saved calibration JSON: skip calibrating")
    parser.add_argument("--skip-b", action="store_true")
    args = parser.parse_args()
    out = {"medusa": part_a()}
    if not args.skip_b:
        out["smollm2"] = part_b(*draft_source(args), args.max_new_tokens, args.budgets, args.calib_prompts,
                                args.eval_prompts, args.calibration)
        (HERE / f"tree_builder_results_{draft_source(args)[1]}.json").write_text(json.dumps(out, indent=1) + "\n")
