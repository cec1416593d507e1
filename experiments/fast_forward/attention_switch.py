"""Plain decoding and PLD of long answers under SDPA, transformers' eager attention and model.attention=auto (eager
where this machine measured it faster, SDPA elsewhere), side by side in one process.

Each prompt is decoded under every attention in turn (the order rotating per prompt and round), so drift on a shared
VM falls on all alike. Every answer is exactly --max-new-tokens long (EOS is not a stop here), so each attention
decodes the same contexts, and the rate is of decoding alone (prefill excluded: a long prompt's prefill would
otherwise weigh as much as the steps compared). Reports decode tokens/s per attention and method, the ratio of means
against SDPA, and how many answers are SDPA's token for token (bf16 flips near-tie argmaxes when the kernel changes).

    python experiments/fast_forward/attention_switch.py [--dtype bfloat16] [--weights int4] [--prompts 6]
        [--max-new-tokens 256] [--dataset summarization] [--rounds 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from specbench.acceptance.exact import ExactAcceptance
from specbench.config import CONF_DIR
from specbench.data.prompts import encode_prompt, load_dataset
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.hardware.measured.attention import eager_windows
from specbench.execution.attention import attention_tag, with_attention
from specbench.models.loading import with_dtype
from specbench.execution.quantize import with_weights
from specbench.sampling import SamplingParams
from specbench.tasks._common import build_model
from specbench.trees.native import NativePolicy

ATTENTIONS = ("sdpa", "eager", "auto")
DRAFTERS = {"plain": lambda target: PlainDrafter(),
            "pld": lambda target: PromptLookupDrafter(target, NativePolicy(11))}  # method=pld's budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--weights", default="int4", choices=["fp", "int8", "int4"])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dataset", default="summarization", choices=["humaneval", "mt_bench", "summarization"])
    parser.add_argument("--out", type=Path, default=Path("experiments/fast_forward/attention_switch.csv"))
    args = parser.parse_args()
    for flag, value in (("--prompts", args.prompts), ("--max-new-tokens", args.max_new_tokens),
                        ("--rounds", args.rounds)):
        if value < 1:
            parser.error(f"{flag} {value} is invalid: give a whole number >= 1")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=smollm2_135m"])
    loaded = build_model(cfg.model, dtype="float32")
    windows = eager_windows(loaded.model)
    print(f"measured key counts where eager attention runs under auto: {windows}")
    # one quantised, cast model; each attention is set on it in turn (set_attn_implementation works in place)
    target = with_dtype(with_weights(loaded, args.weights), args.dtype)
    prompts = load_dataset(args.dataset, args.dataset, num_prompts=args.prompts)
    rows, turn = [], 0
    for round_, prompt in ((r, p) for r in range(args.rounds) for p in prompts):
        ids = encode_prompt(target.tokenizer, prompt, target.chat_template)
        turn += 1
        for attention in ATTENTIONS[turn % 3:] + ATTENTIONS[: turn % 3]:
            run = with_attention(target, attention, windows)
            for method, drafter in DRAFTERS.items():
                decoder = Decoder(run.model, drafter(run), ExactAcceptance(), SamplingParams(), args.max_new_tokens,
                                  [], max_context=run.max_context)  # no EOS: every answer as long as every other
                gen = decoder.generate(ids)
                seconds = gen.wall_time - gen.prefill_time
                rows.append({"round": round_, "prompt": prompt.question_id, "prompt_tokens": len(ids),
                             "attention": attention, "runs": attention_tag(run), "method": method,
                             "tokens": len(gen.tokens) - 1, "seconds": seconds, "answer": tuple(gen.tokens)})
                print(f"{prompt.question_id} {attention:5} {method:5} {len(gen.tokens) - 1} tokens decoded "
                      f"{(len(gen.tokens) - 1) / seconds:.1f} tok/s", flush=True)
    frame = pd.DataFrame(rows)
    reference = frame[frame.attention == "sdpa"].set_index(["round", "prompt", "method"])["answer"]
    frame["same_as_sdpa"] = [a == reference[key] for key, a in
                             zip(zip(frame["round"], frame.prompt, frame.method), frame.answer)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.drop(columns="answer").to_csv(args.out, index=False)
    summary = frame.groupby(["method", "attention"]).agg(tokens=("tokens", "sum"), seconds=("seconds", "sum"),
                                                         same_as_sdpa=("same_as_sdpa", "sum"), answers=("prompt", "size"))
    summary["tok_per_s"] = summary.tokens / summary.seconds
    summary["vs_sdpa"] = summary.tok_per_s / summary.xs("sdpa", level="attention").tok_per_s.reindex(
        summary.index.get_level_values("method")).to_numpy()
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(summary.to_string())
    print(f"{args.weights} weights, {args.dtype}, {args.dataset} x {len(prompts)} prompts x {args.rounds} rounds, "
          f"{args.max_new_tokens} new tokens (prompts of {frame.prompt_tokens.min()}-{frame.prompt_tokens.max()} "
          f"tokens), greedy; {torch.get_num_threads()} threads; {torch.backends.cpu.get_cpu_capability()}; decode "
          f"rates without prefill; vs_sdpa is a ratio of means (total tokens / total seconds)")


if __name__ == "__main__":
    main()
