"""tree=native: the method shapes its own draft (PLD's copied chain, PPD's dynamic sparse tree, SSSD's scored tree);
the config only sets tree.budget, the same size knob every other policy reads."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.trees.policy import DraftExpander, TreePolicy
from specbench.trees.token_tree import TokenTree


class NativePolicy(TreePolicy):
    name = "native"

    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        raise SpecbenchError("tree=native only sets tree.budget for a method that builds its own tree; this method "
                             "drafts through a tree policy: pick tree=chain, dynamic, static or greedy")
