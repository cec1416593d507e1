"""Issue 3, must-show 3: draft_model on SmolLM2-135M, 20 MT-Bench prompts, in one process.

bf16, greedy: autoregressive baseline; draft_model as a chain and as a dynamic (EAGLE-2) tree: tau and speedup.
fp32, greedy: the same two, lossless match (share of prompts whose tokens equal autoregressive decoding's).
bf16, temperature 0.7 (part "hot"): autoregressive sampling baseline; rejection sampling with a chain of sampled
drafts (and, with part "dynamic-rejection", the dynamic tree as deterministic candidates): tau and speedup; typical
acceptance (dynamic tree): tau, speedup, and how often its output differs from greedy decoding.

    python experiments/issue3_draft_trees/benchmark.py [--layers 24 | --checkpoint ARTIFACT] [--max-new-tokens 32] [--prompts 20]
        [--parts bf16 hot fp32]
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


def first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(draft: dict, label: str, max_new_tokens: int, num_prompts: int, chain_depth: int, tree: dict, parts: list[str]) -> dict:
    set_threads()
    results: dict = {"draft": label, "max_new_tokens": max_new_tokens, "prompts": num_prompts,
                     "chain_depth": chain_depth, "dynamic": tree}

    def chain(temperature: float = 0.0):
        return DraftModelDrafter(target, ChainPolicy(depth=chain_depth), **draft, temperature=temperature)

    def dynamic():
        return DraftModelDrafter(target, DynamicPolicy(**tree), **draft)

    def report(name, result, baseline=None, extra=""):
        row = {"tau": result.tau, "tokens_per_s": result.tokens_per_s}
        if baseline is not None:
            row["speedup"] = result.tokens_per_s / baseline.tokens_per_s
        results[name] = {**row, **({"extra": extra} if extra else {})}
        speed = f" speedup {row['speedup']:.2f}x" if "speedup" in row else ""
        print(f"[{now()}] {name}: tau {result.tau:.2f}, {result.tokens_per_s:.1f} tok/s{speed} {extra}", flush=True)

    greedy, hot = SamplingParams(), SamplingParams(temperature=0.7)
    if "bf16" in parts or "hot" in parts:
        target = smollm2("bfloat16")
        prompts = mt_bench_ids(target.tokenizer, 0, num_prompts)
        ar = run(target, AutoregressiveDrafter(), ExactAcceptance(), greedy, prompts, max_new_tokens)
        report("bf16 greedy autoregressive", ar)
    if "bf16" in parts:
        for name, drafter in (("chain", chain()), ("dynamic", dynamic())):
            result = run(target, drafter, ExactAcceptance(), greedy, prompts, max_new_tokens)
            same = sum(a == b for a, b in zip(result.outputs, ar.outputs))
            report(f"bf16 greedy draft_model {name}", result, ar, f"(bf16 match {same}/{num_prompts})")
    if "hot" in parts:
        ar_hot = run(target, AutoregressiveDrafter(), ExactAcceptance(), hot, prompts, max_new_tokens)
        report("bf16 T=0.7 autoregressive sampling", ar_hot)
        result = run(target, chain(0.7), RejectionSampling(), hot, prompts, max_new_tokens)
        report("bf16 T=0.7 rejection, chain (sampled drafts)", result, ar_hot)
        result = run(target, dynamic(), TypicalAcceptance(), hot, prompts, max_new_tokens)
        differ = sum(a != b for a, b in zip(result.outputs, ar.outputs))
        agree = sum(first_divergence(a, b) for a, b in zip(result.outputs, ar.outputs)) / num_prompts
        report("bf16 T=0.7 typical, dynamic tree", result, ar_hot,
               f"(differs from greedy on {differ}/{num_prompts} prompts; first difference after {agree:.1f} tokens "
               f"on average; speedup vs greedy AR {result.tokens_per_s / ar.tokens_per_s:.2f}x)")
        results["typical_differs_from_greedy"] = differ
        if "dynamic-rejection" in parts:
            result = run(target, dynamic(), RejectionSampling(), hot, prompts, max_new_tokens)
            report("bf16 T=0.7 rejection, dynamic tree (deterministic candidates)", result, ar_hot)
    if "fp32" in parts:
        target = smollm2("float32")
        prompts = mt_bench_ids(target.tokenizer, 0, num_prompts)
        ar = run(target, AutoregressiveDrafter(), ExactAcceptance(), greedy, prompts, max_new_tokens)
        report("fp32 greedy autoregressive", ar)
        for name, drafter in (("chain", chain()), ("dynamic", dynamic())):
            result = run(target, drafter, ExactAcceptance(), greedy, prompts, max_new_tokens)
            same = sum(a == b for a, b in zip(result.outputs, ar.outputs))
            report(f"fp32 greedy draft_model {name}", result, ar, f"(lossless match {same}/{num_prompts})")
            results[f"fp32 lossless match {name}"] = same / num_prompts
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_draft_args(parser, 24)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--chain-depth", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--total-tokens", type=int, default=16)
    parser.add_argument("--parts", nargs="+", default=["bf16", "hot", "fp32"])
    args = parser.parse_args()
    out = main(*draft_source(args), args.max_new_tokens, args.prompts, args.chain_depth,
               {"top_k": args.top_k, "depth": args.depth, "total_tokens": args.total_tokens}, args.parts)
    name = f"benchmark_results_{draft_source(args)[1]}_{'_'.join(args.parts)}.json"
    (HERE / name).write_text(json.dumps(out, indent=1) + "\n")
