"""Calibration for the greedy tree builder: how often the i-th candidate at depth d is accepted, for any drafter.

The drafter runs through the ordinary decoding loop with greedy exact acceptance and a probe tree: at every depth d
the rank-0 node gets `ranks` children (Medusa's per-head top-k; for a draft model, its top-k after the top-1 path).
Greedy verification gives the target's own next token at every node, so after each step we know, for every accepted
node, which of its children (if any) was right. accept_prob[d][i] = hits / trials of the i-th child at depth d+1,
given its parent was accepted: the conditional probability the greedy builder multiplies along a path.

    python run.py task=calibrate method=draft_model dataset=mt_bench +calibration.out=calib.json
    (+calibration.depth=5 +calibration.ranks=8 +calibration.num_prompts=20 +calibration.max_new_tokens=128)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.base import DecodeState, Drafter, StepOutcome
from specbench.errors import SpecbenchError
from specbench.trees.static import StaticPolicy
from specbench.trees.token_tree import TokenTree


def probe_tree(depth: int, ranks: int) -> StaticPolicy:
    """The rank-0 chain, each of its nodes with `ranks` children: every depth gets all ranks measured."""
    if depth < 1 or ranks < 1:
        raise SpecbenchError(f"calibration needs depth >= 1 and ranks >= 1, got depth={depth}, ranks={ranks}")
    return StaticPolicy(choices=[[0] * d + [r] for d in range(depth) for r in range(ranks)])


@dataclass
class Calibration:
    depth: int
    ranks: int
    hits: list[list[int]] = field(default_factory=list)
    trials: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hits = self.hits or [[0] * self.ranks for _ in range(self.depth)]
        self.trials = self.trials or [[0] * self.ranks for _ in range(self.depth)]

    def record(self, tree: TokenTree, path: list[int], logits: torch.Tensor) -> None:
        """Score the children of every accepted node against the target's argmax there."""
        truth = logits[path].argmax(-1).tolist()
        for level, parent in enumerate(path[: self.depth]):
            for rank, child in enumerate(tree.children(parent)[: self.ranks]):
                self.trials[level][rank] += 1
                self.hits[level][rank] += int(tree.tokens[child]) == truth[level]

    @property
    def accept_prob(self) -> list[list[float]]:
        return [[h / t if t else 0.0 for h, t in zip(hs, ts)] for hs, ts in zip(self.hits, self.trials)]

    def save(self, path: str | Path, **meta) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {**meta, "depth": self.depth, "ranks": self.ranks, "accept_prob": self.accept_prob,
               "hits": self.hits, "trials": self.trials}
        path.write_text(json.dumps(doc, indent=1) + "\n")
        return path


class RecordingDrafter(Drafter):
    """Passes every call through to the drafter and feeds each verified step to a Calibration."""

    def __init__(self, inner: Drafter, calibration: Calibration) -> None:
        self.inner, self.calibration = inner, calibration
        self.name, self.needs_hidden_states = inner.name, inner.needs_hidden_states
        self._prompt: TokenTree | None = None

    def reset(self, state: DecodeState) -> None:
        self.inner.reset(state)

    def prefill_extras(self, prompt: TokenTree):
        """The drafter's own (EAGLE's hands it the prompt's features); the prefill it then observes as a step holds
        the prompt, not a draft, so it is not recorded."""
        self._prompt = prompt
        return self.inner.prefill_extras(prompt)

    def propose(self, state: DecodeState) -> TokenTree:
        return self.inner.propose(state)

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.tree is not self._prompt:
            self.calibration.record(outcome.tree, outcome.path, outcome.verify.logits)
        self.inner.observe(outcome)

    def verify_extras(self, tree: TokenTree):
        return self.inner.verify_extras(tree)


def calibrate(model, drafter: Drafter, prompts: list[list[int]], depth: int, ranks: int, max_new_tokens: int,
              eos_token_ids=()) -> Calibration:
    """Greedy-decode every prompt with the drafter (built with probe_tree(depth, ranks)) and count acceptances."""
    calibration = Calibration(depth, ranks)
    decoder = Decoder(model, RecordingDrafter(drafter, calibration), ExactAcceptance(), SamplingParams(),
                      max_new_tokens, eos_token_ids)
    for ids in tqdm(prompts, desc=f"calibrating {drafter.name}", unit="prompt", dynamic_ncols=True):
        decoder.generate(ids)
    return calibration
