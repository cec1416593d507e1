"""Plain decoding as a drafter that proposes nothing: plain decoding runs through the same decoder loop."""

from specbench.drafters.base import DecodeState, Drafter
from specbench.names import PLAIN
from specbench.trees.token_tree import TokenTree


class PlainDrafter(Drafter):
    name = PLAIN

    def __init__(self, target=None, tree=None) -> None:
        """Proposes nothing, whatever the budget."""

    def propose(self, state: DecodeState) -> TokenTree:
        return TokenTree.chain(state.root, [])
