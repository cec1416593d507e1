"""The Evaluator runs the autoregressive baseline and the method on the same prompts, in the same process and
dtype, appends one record per prompt and method, and turns the records into the run's summary, plots and logs."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from specbench.acceptance.base import AcceptanceRule
from specbench.acceptance.exact import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.data.prompts import PromptDataset, encode_prompt
from specbench.decoding import Decoder, Generation
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.base import Drafter
from specbench.errors import SpecbenchError
from specbench.evaluation.metrics import BASELINE
from specbench.models.loading import LoadedModel
from specbench.reporting.store import RecordStore


@dataclass
class EvalSettings:
    max_new_tokens: int = 128
    seed: int = 0
    warmup: int = 1
    chat_template: bool = True
    baseline: bool = True  # run autoregressive decoding on the same prompts (needed for speedup and lossless match)


class Evaluator:
    def __init__(self, target: LoadedModel, method: str, drafter: Drafter, acceptance: AcceptanceRule,
                 sampling: SamplingParams, dataset: PromptDataset, settings: EvalSettings, run_dir: str | Path) -> None:
        self.target, self.method, self.drafter = target, method, drafter
        self.acceptance, self.sampling, self.dataset, self.settings = acceptance, sampling, dataset, settings
        self.run_dir = Path(run_dir)
        self.store = RecordStore(self.run_dir / "records.jsonl")

    def _decoder(self, drafter: Drafter, acceptance: AcceptanceRule) -> Decoder:
        return Decoder(self.target.model, drafter, acceptance, self.sampling, self.settings.max_new_tokens,
                       self.target.eos_token_ids, seed=self.settings.seed, max_context=self.target.max_context)

    def run(self) -> pd.DataFrame:
        """Decode every prompt not yet in records.jsonl; return the records of the whole run folder."""
        encoded = [(p, encode_prompt(self.target.tokenizer, p, self.settings.chat_template)) for p in self.dataset]
        for p, ids in encoded:  # fail before spending minutes on the prompts that do fit
            if len(ids) >= self.target.max_context:
                raise SpecbenchError(f"prompt {p.question_id} has {len(ids)} tokens, more than the model's context "
                                     f"of {self.target.max_context}; drop it from the dataset or raise the context")
        runs = [(self.method, self.drafter, self.acceptance)]
        if self.settings.baseline and self.method != BASELINE:
            # the baseline samples from the target itself: a lossy rule (typical's greedy first token) must not leak in
            runs.insert(0, (BASELINE, AutoregressiveDrafter(), ExactAcceptance()))
        decoders = [(name, self._decoder(d, rule), d) for name, d, rule in runs]
        todo = [(p, ids) for p, ids in encoded if any(not self.store.has(n, p.question_id) for n, _, _ in decoders)]
        if todo:
            self._warmup(decoders, todo[0][1])
        bar = tqdm(todo, desc=f"{self.method} on {self.dataset.name}", unit="prompt", dynamic_ncols=True)
        for prompt, ids in bar:
            for name, decoder, drafter in decoders:
                if self.store.has(name, prompt.question_id):
                    continue
                gen = decoder.generate(ids)
                self.store.append(self._record(name, drafter, decoder.acceptance, prompt, gen))
            bar.set_postfix_str(self._postfix())
        return self.store.frame()

    def _warmup(self, decoders, ids: list[int]) -> None:
        """Untimed generations first, so one-time costs (allocator, kernels, caches) do not land on the first prompt."""
        for _ in range(self.settings.warmup):
            for _, decoder, _ in decoders:
                limit, decoder.max_new_tokens = decoder.max_new_tokens, min(16, decoder.max_new_tokens)
                decoder.generate(ids)
                decoder.max_new_tokens = limit

    def _record(self, name: str, drafter: Drafter, rule: AcceptanceRule, prompt, gen: Generation) -> dict:
        params, nbytes = drafter.parameters_bytes()
        return {
            "method": name, "question_id": prompt.question_id, "category": prompt.category,
            "prompt_len": gen.prompt_len, "new_tokens": len(gen.tokens), "steps": len(gen.steps),
            "wall_time": gen.wall_time, "prefill_time": gen.prefill_time,
            "draft_time": sum(s.draft_time for s in gen.steps), "verify_time": sum(s.verify_time for s in gen.steps),
            "accept_lengths": gen.accept_lengths, "tree_sizes": [s.tree_size for s in gen.steps],
            "tree_depths": [s.tree_depth for s in gen.steps],
            "framework_times": [round(s.step_time - s.draft_time - s.verify_time, 7) for s in gen.steps],
            "output_ids": gen.tokens, "kv_cache_bytes": gen.kv_cache_bytes,
            "peak_mem_mb": peak_memory_mb(self.target.model.device), "drafter_params": params,
            "drafter_bytes": nbytes, "accept": rule.name, "lossless_rule": rule.lossless,
            "temperature": self.sampling.temperature, "token_logprobs": [round(x, 5) for x in gen.token_logprobs],
        }

    def _postfix(self) -> str:
        frame = self.store.frame()
        parts = []
        for name, grp in frame.groupby("method", sort=False):
            parts.append(f"{name} {grp['new_tokens'].sum() / grp['wall_time'].sum():.1f} tok/s")
        return ", ".join(parts)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
