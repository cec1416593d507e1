"""Speedup measured prompt by prompt: autoregressive and each method run back to back on the same prompt, so
both see the same machine load (this 2-core machine is shared with other benchmarks; a run-after-run comparison
mixes load changes into the ratio).

    python experiments/issue3_draft_trees/paired_speed.py [--layers 24 | --checkpoint ARTIFACT] [--prompts 5]
        [--max-new-tokens 32]

Also counts how often each method's output equals greedy AR's (bf16: near-ties may flip; typical: lossy).
"""

from __future__ import annotations

import argparse
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
from specbench.acceptance.rejection import RejectionSampling
from specbench.acceptance.typical import TypicalAcceptance
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_draft_args(parser, 24)
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    set_threads()
    draft, label = draft_source(args)
    target = smollm2("bfloat16")
    run(target, AutoregressiveDrafter(), ExactAcceptance(), SamplingParams(), [[1, 2, 3]], 8)  # warm-up
    greedy, hot = SamplingParams(), SamplingParams(temperature=0.7)
    methods = {
        "greedy chain": (lambda: ChainPolicy(depth=3), ExactAcceptance(), greedy),
        "greedy dynamic": (lambda: DynamicPolicy(top_k=4, depth=4, total_tokens=12), ExactAcceptance(), greedy),
        "T=0.7 rejection chain": (lambda: ChainPolicy(depth=3), RejectionSampling(), hot),
        "T=0.7 typical dynamic": (lambda: DynamicPolicy(top_k=4, depth=4, total_tokens=12), TypicalAcceptance(), hot),
    }
    walls = {name: [0.0, 0.0] for name in methods}  # seconds: [method, its autoregressive baseline]
    tokens = {name: [0, 0] for name in methods}
    taus = {name: [] for name in methods}
    same_as_greedy = {name: 0 for name in methods}
    for ids in mt_bench_ids(target.tokenizer, 0, args.prompts):
        greedy_output = None
        for name, (policy, rule, sampling) in methods.items():
            drafter = DraftModelDrafter(target, policy(), **draft, temperature=sampling.temperature)
            baseline = run(target, AutoregressiveDrafter(), ExactAcceptance(), sampling, [ids], args.max_new_tokens,
                           warmup=False)
            result = run(target, drafter, rule, sampling, [ids], args.max_new_tokens, warmup=False)
            walls[name][0] += result.wall_time
            walls[name][1] += baseline.wall_time
            tokens[name][0] += result.new_tokens
            tokens[name][1] += baseline.new_tokens
            taus[name].append(result.tau)
            greedy_output = baseline.outputs[0] if sampling.greedy else greedy_output
            same_as_greedy[name] += result.outputs[0] == greedy_output
        print(f"[{now()}] prompt done", flush=True)
    out = {}
    for name in methods:
        method_tps, base_tps = (tokens[name][i] / walls[name][i] for i in (0, 1))
        out[name] = {"speedup": method_tps / base_tps, "mean_tau": sum(taus[name]) / len(taus[name]),
                     "same_as_greedy": same_as_greedy[name], "prompts": args.prompts}
        print(f"{name}: paired speedup {out[name]['speedup']:.2f}x, mean tau {out[name]['mean_tau']:.2f}, "
              f"output = greedy AR on {same_as_greedy[name]}/{args.prompts} prompts")
    (HERE / f"paired_speed_{label}_{args.max_new_tokens}.json").write_text(json.dumps(out, indent=1) + "\n")
