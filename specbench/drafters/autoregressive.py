"""Autoregressive decoding as a drafter that proposes nothing: the baseline runs through the same decoder loop."""

from specbench.drafters.base import DecodeState, Drafter
from specbench.trees.token_tree import TokenTree


class AutoregressiveDrafter(Drafter):
    name = "autoregressive"

    def __init__(self, target=None, tree=None) -> None:
        """Proposes nothing, whatever the budget."""

    def propose(self, state: DecodeState) -> TokenTree:
        return TokenTree.chain(state.root, [])
