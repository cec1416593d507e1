"""EAGLE-2's dynamic tree: grow by cumulative draft log-probability, then rerank down to a node budget.

For depth steps, the top_k frontier nodes (by cumulative log-probability) are expanded with their top_k children
each; at the end the budget - 1 best nodes of the whole tree are kept. Because a child never scores higher than
its parent, the kept set is closed under ancestors. The children are always the draft's top-k, also when drafting
samples: the pruning depends on the tokens drawn, so sampled children would no longer be the plain draws that
rejection sampling corrects. The tree therefore carries no draft distribution and rejection treats its tokens as
deterministic candidates, which stays lossless.
"""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.trees.policy import DraftExpander, GrowingTree, TreePolicy, draw_children
from specbench.trees.token_tree import TokenTree


class DynamicPolicy(TreePolicy):
    name = "dynamic"

    def __init__(self, budget: int = 61, top_k: int = 10, depth: int = 5) -> None:
        super().__init__(budget)
        for knob, value in (("top_k", top_k), ("depth", depth)):
            if value < 1:
                raise SpecbenchError(f"tree.{knob}={value} is invalid: it must be >= 1")
        self.top_k, self.depth = top_k, depth

    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        tree = GrowingTree.rooted(root)
        frontier = [0]
        # the budget - 1 kept nodes are closed under ancestors, so none lies deeper than budget - 1: a deeper level
        # would be drafted (a forward of the draft each) and always dropped
        for _ in range(min(self.depth, self.budget - 1)):
            rows = expander.expand(tree, frontier)
            added = []
            for node, probs in zip(frontier, rows):
                for token in draw_children(probs, self.top_k):
                    added.append(tree.add(node, token, float(probs[token].clamp_min(1e-30).log())))
            frontier = sorted(added, key=lambda n: (-tree.logp[n], n))[: self.top_k]
            if not frontier:
                break
        best = sorted(range(1, len(tree.tokens)), key=lambda n: (-tree.logp[n], n))[: self.budget - 1]
        return tree.freeze(keep=[0] + sorted(best))
