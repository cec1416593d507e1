"""Prompt-lookup decoding (Saxena 2023): copy what followed the latest earlier occurrence of the last n-gram.

Same matching rule as transformers' PromptLookupCandidateGenerator (n from max_ngram down to min_ngram, the
earliest match, up to num_pred_tokens copied), so outputs and speeds can be compared with its generate().
"""

from __future__ import annotations

import torch

from specbench.drafters.base import DecodeState, Drafter
from specbench.errors import SpecbenchError
from specbench.trees.policy import TreePolicy
from specbench.trees.token_tree import TokenTree


def find_ngram_continuation(tokens: torch.Tensor, max_ngram: int, min_ngram: int, num_pred_tokens: int) -> torch.Tensor:
    """The tokens that followed the earliest earlier match of the longest suffix n-gram (empty if none)."""
    length = tokens.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = tokens.unfold(0, n, 1)  # (length - n + 1, n)
        matches = (windows[:-1] == tokens[-n:]).all(dim=1).nonzero().flatten()  # exclude the suffix itself
        for start in matches.tolist():
            begin = start + n
            end = min(begin + num_pred_tokens, length)
            if begin < end:
                return tokens[begin:end]
    return tokens[:0]


class PromptLookupDrafter(Drafter):
    name = "pld"
    drafts_from_tokens = True

    def __init__(self, target, tree: TreePolicy, max_ngram: int = 3, min_ngram: int = 1) -> None:
        """Copies up to tree.budget - 1 tokens (transformers' num_output_tokens)."""
        if not 1 <= min_ngram <= max_ngram:
            raise SpecbenchError(f"pld needs 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram, self.num_pred_tokens = max_ngram, min_ngram, tree.budget - 1

    def propose(self, state: DecodeState) -> TokenTree:
        tokens = torch.tensor(state.tokens, dtype=torch.long)
        return TokenTree.chain(state.root, find_ngram_continuation(tokens, self.max_ngram, self.min_ngram,
                                                                   self.num_pred_tokens))
