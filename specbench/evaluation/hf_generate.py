"""transformers' own `generate` as one more run beside the methods (eval.hf_generate=true): the number users know,
so that our plain decoding loop is measured against it on the same prompts, in the same process.

It has the Decoder's interface (max_new_tokens, generate(prompt_ids) -> Generation), greedy only, and records one
step per token after the first, timed by a streamer callback, so every metric reads it like plain decoding.
"""

from __future__ import annotations

import time

import torch
from transformers.generation.streamers import BaseStreamer

from specbench.decoding import Generation, StepRecord
from specbench.errors import SpecbenchError
from specbench.sampling import SamplingParams

HF_GENERATE = "hf_generate"


class _Clock(BaseStreamer):
    """generate() hands the streamer the prompt, then each new token: the times of those calls."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def check_greedy(sampling: SamplingParams) -> None:
    if sampling.temperature != 0:
        raise SpecbenchError(f"eval.hf_generate compares greedy decoding; sampling.temperature="
                             f"{sampling.temperature} would need it to match our sampler draw for draw: use 0")


class HFGenerate:
    def __init__(self, model, sampling: SamplingParams, max_new_tokens: int, eos_token_ids, pad_token_id: int) -> None:
        check_greedy(sampling)
        self.model, self.max_new_tokens, self.eos, self.pad = model, max_new_tokens, list(eos_token_ids), pad_token_id

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int]) -> Generation:
        clock = _Clock()
        start = time.perf_counter()
        out = self.model.generate(torch.tensor([prompt_ids], device=self.model.device), do_sample=False,
                                  max_new_tokens=self.max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                                  streamer=clock, use_cache=True, temperature=None, top_p=None, top_k=None)
        end = time.perf_counter()
        tokens = out[0, len(prompt_ids):].tolist()
        stamps = clock.times[1:]  # the first call is the prompt
        steps = [StepRecord(1, 0, 0, draft_time=0.0, verify_time=b - a, step_time=b - a, tried_deeper=False)
                 for a, b in zip(stamps, stamps[1:])]
        return Generation(len(prompt_ids), tokens, prefill_time=stamps[0] - start if stamps else end - start,
                          wall_time=end - start, steps=steps)
