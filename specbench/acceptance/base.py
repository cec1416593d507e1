"""The contract every acceptance rule follows (vLLM's 'rejection sampler' role)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specbench.sampling import SamplingParams
from specbench.trees.token_tree import TokenTree


@dataclass
class Acceptance:
    path: list[int]  # tree node indices from the root (0) to the last accepted node
    next_token: int  # the bonus token: sampled from the target at the last accepted node (or its residual)

    @property
    def accepted(self) -> int:
        """Draft tokens accepted, the root excluded."""
        return len(self.path) - 1


class AcceptanceRule(ABC):
    name: str = "rule"
    lossless: bool = True  # True: output follows the target's distribution (equals it token for token when greedy)

    @abstractmethod
    def accept(self, tree: TokenTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None = None) -> Acceptance:
        """Pick the accepted path given the target logits at every tree node (rows aligned with tree.tokens)."""
