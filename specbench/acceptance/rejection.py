"""Lossless speculative sampling for chains (Leviathan et al., Chen et al.) and trees (SpecInfer-style).

At a node the target distribution is p. Its children are tested one by one in index order, each against its
proposal q: child x is accepted with probability min(1, p(x) / q(x)); on rejection the target moves to the residual
norm(max(p - q, 0)) and, for sampled siblings, q drops x and renormalises (the siblings were drawn without
replacement). If every child is rejected, the bonus token is drawn from the last residual. This is the recursive
rejection sampling of Jeon et al. (2024), which yields exactly p.

A node without a recorded draft distribution (n-gram drafters, top-k candidates, dynamic trees) has deterministic
candidates: q is one-hot at x, so x is accepted with probability p(x) and on rejection x is zeroed out of p. That is
lossless whatever chose the candidates, as long as the choice does not look at the target's random draws.
"""

from __future__ import annotations

import torch

from specbench.acceptance.base import Acceptance, AcceptanceRule
from specbench.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.trees.token_tree import TokenTree


class RejectionSampling(AcceptanceRule):
    name = "rejection"
    lossless = True

    def accept(self, tree: TokenTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None = None) -> Acceptance:
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        children: dict[int, list[int]] = {}
        for node in range(1, len(tokens)):
            children.setdefault(parents[node], []).append(node)
        node, path = 0, [0]
        while True:
            p = sampling.probs(logits[node]).cpu()
            q = self._draft_dist(tree, node)
            chosen = None
            for child in children.get(node, []):
                x = tokens[child]
                q_x = q[x] if q is not None else torch.ones(())
                if q_x <= 0:
                    raise SpecbenchError(f"tree node {child} holds token {x}, which its recorded draft distribution "
                                         f"gives probability 0; the drafter recorded the wrong q")
                if float(torch.rand((), generator=generator)) < float(p[x] / q_x):
                    chosen = child
                    break
                q_row = q if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).to(p)
                p = self.residual(p, q_row)
                if q is not None:
                    q = q.clone()
                    q[x] = 0
                    q = q / q.sum() if q.sum() > 0 else None
            if chosen is None:
                return Acceptance(path=path, next_token=int(torch.multinomial(p, 1, generator=generator)))
            node = chosen
            path.append(node)

    @staticmethod
    def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """norm(max(p - q, 0)): what the target still owes after a rejected proposal from q."""
        rest = (p - q).clamp_min(0)
        total = rest.sum()
        return rest / total if total > 0 else p

    @staticmethod
    def _draft_dist(tree: TokenTree, node: int) -> torch.Tensor | None:
        """The distribution node's children were sampled from, or None for deterministic candidates."""
        if tree.draft_probs is None:
            return None
        row = tree.draft_probs[node].float()
        return row if row.sum() > 0 else None
