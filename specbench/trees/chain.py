"""A chain: the draft's top-1 continuation (or one sample per step when drafting samples), budget - 1 tokens deep."""

from __future__ import annotations

from specbench.trees.policy import DraftExpander, GrowingTree, TreePolicy, draw_children
from specbench.trees.token_tree import TokenTree


class ChainPolicy(TreePolicy):
    name = "chain"

    def __init__(self, budget: int = 6) -> None:
        super().__init__(budget)
        self.depth = budget - 1

    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        generator = getattr(expander, "generator", None)
        tree = GrowingTree.rooted(root)
        node = 0
        for _ in range(self.depth):
            probs = expander.expand(tree, [node])[0]
            picked = draw_children(probs, 1, generator)  # top-1, or one sample from q (Leviathan) when sampling
            if not picked:
                break
            tree.dists[node] = probs
            node = tree.add(node, picked[0], float(probs[picked[0]].clamp_min(1e-30).log()))
        return tree.freeze(with_dists=generator is not None)
