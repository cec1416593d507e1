"""Token trees and the policies that shape them (chain, static, greedy, dynamic, ...)."""

from specbench.trees.token_tree import TokenTree

__all__ = ["TokenTree"]
