"""Exact acceptance: follow the child whose token equals the target's own choice at each node.

Greedy, the target's choice is its argmax, so the output equals greedy decoding token for token. With sampling, the
target's choice is a sample from its distribution (REST's sample-and-match), which is lossless as well.
"""

from __future__ import annotations

import torch

from specbench.acceptance.base import Acceptance, AcceptanceRule
from specbench.sampling import SamplingParams, greedy_tokens
from specbench.trees.token_tree import TokenTree


class ExactAcceptance(AcceptanceRule):
    name = "exact"
    lossless = True

    def accept(self, tree: TokenTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None = None) -> Acceptance:
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        if sampling.greedy:  # one argmax over all rows beats one per visited node
            choices = greedy_tokens(logits).tolist()
            choose = choices.__getitem__
        else:
            choose = lambda node: sampling.sample(logits[node], generator)  # noqa: E731
        node, path = 0, [0]
        while True:
            target = choose(node)
            nxt = next((c for c in range(node + 1, len(tokens)) if parents[c] == node and tokens[c] == target), None)
            if nxt is None:
                return Acceptance(path=path, next_token=target)
            node = nxt
            path.append(node)
