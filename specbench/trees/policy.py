"""Tree policies shape the draft: which nodes to expand and how many children each gets.

A policy grows a GrowingTree level by level, asking a DraftExpander (the drafter) for the draft distribution after
each node it wants to expand. The same policy therefore serves a draft model (the distribution depends on the
path), Medusa heads or PPD prompt tokens (it depends on the depth only).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specbench.errors import SpecbenchError
from specbench.trees.token_tree import TokenTree


@dataclass
class GrowingTree:
    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    logp: list[float] = field(default_factory=lambda: [0.0])  # cumulative draft log-probability of the path
    dists: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> distribution its children came from

    @classmethod
    def rooted(cls, root: int) -> "GrowingTree":
        return cls(tokens=[root])

    def add(self, parent: int, token: int, logp: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.logp.append(self.logp[parent] + logp)
        return len(self.tokens) - 1

    def path_tokens(self, node: int) -> list[int]:
        out = []
        while node > 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def freeze(self, keep: list[int] | None = None, with_dists: bool = False) -> TokenTree:
        """A TokenTree of the kept nodes (all by default; keep must be closed under ancestors and sorted)."""
        keep = keep if keep is not None else list(range(len(self.tokens)))
        remap = {old: new for new, old in enumerate(keep)}
        parents = [remap[self.parents[i]] if i else -1 for i in keep]
        probs = None
        if with_dists and self.dists:
            vocab = next(iter(self.dists.values())).shape[-1]
            probs = torch.zeros(len(keep), vocab)
            for old, new in remap.items():
                if old in self.dists:
                    probs[new] = self.dists[old]
        return TokenTree(torch.tensor([self.tokens[i] for i in keep]), torch.tensor(parents), probs)


class DraftExpander(Protocol):
    """What a drafter offers tree policies.

    An expander may carry a `generator` attribute: when it is not None the drafter samples, so policies draw children
    from the draft distribution (see draw_children) and record it in the tree for lossless rejection sampling.
    """

    def expand(self, tree: GrowingTree, nodes: list[int]) -> torch.Tensor:
        """(len(nodes), V) draft probabilities of the token that follows each node."""


def draw_children(probs: torch.Tensor, k: int, generator: torch.Generator | None = None) -> list[int]:
    """Up to k distinct tokens of nonzero probability, best first.

    Without a generator: the top-k. With one: k draws without replacement in draw order (Gumbel top-k), the order in
    which rejection sampling must test siblings to stay lossless.
    """
    k = min(k, probs.shape[-1])
    if k <= 0:
        return []
    if generator is None:
        keys = probs
    else:
        uniform = torch.rand(probs.shape, generator=generator).clamp_(1e-20, 1.0)
        keys = probs.float().log() - torch.log(-torch.log(uniform))
    # zero-probability tokens rank last in either order: dropped after one pass over the vocabulary, not counted first
    top = torch.topk(keys, k).indices
    return top[probs[top] > 0].tolist()


class TreePolicy(ABC):
    """budget: nodes per verification forward, root included -- the one size knob of every policy (tree.budget)."""

    name: str = "policy"

    def __init__(self, budget: int) -> None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 2:
            raise SpecbenchError(f"tree.budget={budget!r} is invalid: it counts the root, so it must be an integer "
                                 f">= 2 (use method=plain for no draft at all)")
        self.budget = budget

    @abstractmethod
    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        """Grow a tree under root by calling expander.expand on the nodes the policy chooses."""

    def reset(self) -> None:
        """A new generation starts (an adaptive policy, such as LLMCad's trigger, forgets what it learned)."""

    def observe(self, tree: TokenTree, path: list[int]) -> None:
        """The tree it built was verified and `path` accepted: an adaptive policy updates itself here."""
