"""A chain: the draft's top-1 continuation, depth tokens deep (classic speculative decoding)."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.trees.policy import DraftExpander, GrowingTree, TreePolicy
from specbench.trees.token_tree import TokenTree


class ChainPolicy(TreePolicy):
    name = "chain"

    def __init__(self, depth: int = 5) -> None:
        if depth < 1:
            raise SpecbenchError(f"tree.depth={depth} is invalid: a chain needs depth >= 1")
        self.depth = depth

    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        tree = GrowingTree.rooted(root)
        node = 0
        for _ in range(self.depth):
            probs = expander.expand(tree, [node])[0]
            tree.dists[node] = probs
            token = int(probs.argmax())
            node = tree.add(node, token, float(probs[token].clamp_min(1e-30).log()))
        return tree.freeze()
