"""TokenTree: the draft that one verification forward checks.

Node 0 is the root: the last committed token, which is not yet in the target's KV cache. Every other node is a
draft token whose parent comes before it. From the parent indices the tree derives what verification needs: the
attention mask (each node sees the cache, its ancestors and itself), the position ids (context length + depth)
and the root-to-leaf paths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from specbench.errors import SpecbenchError


@dataclass
class TokenTree:
    tokens: torch.Tensor  # (n,) long; tokens[0] is the root
    parents: torch.Tensor  # (n,) long; parents[0] == -1, parents[i] < i
    draft_probs: torch.Tensor | None = None  # (n, V) draft distribution each node's children were drawn from
    depths: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        self.parents = torch.as_tensor(self.parents, dtype=torch.long).reshape(-1)
        n = self.tokens.numel()
        if n == 0:
            raise SpecbenchError("TokenTree needs at least the root node; got an empty token list")
        if self.parents.numel() != n:
            raise SpecbenchError(f"TokenTree has {n} tokens but {self.parents.numel()} parent indices; they must match")
        if int(self.parents[0]) != -1:
            raise SpecbenchError(f"TokenTree node 0 must be the root with parent -1, got parent {int(self.parents[0])}")
        parents = self.parents.tolist()
        depths = [0] * n
        for i in range(1, n):
            p = parents[i]
            if p < 0 or p >= n:
                raise SpecbenchError(f"TokenTree node {i} has parent {p}, outside the valid range 0..{n - 1}")
            if p >= i:
                raise SpecbenchError(
                    f"TokenTree node {i} has parent {p}, which comes at or after it; parents must come before children"
                )
            depths[i] = depths[p] + 1
        self.depths = torch.tensor(depths, dtype=torch.long)
        self._chain = parents == list(range(-1, n - 1))  # read two or three times a step: kept, not recomputed
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise SpecbenchError(f"TokenTree draft_probs has {self.draft_probs.shape[0]} rows for {n} nodes")

    @classmethod
    def chain(cls, root: int, draft: list[int] | torch.Tensor, draft_probs: torch.Tensor | None = None) -> "TokenTree":
        """The root and `draft` one after another. A chain is a valid tree by construction, so it is built without
        __post_init__'s checks and its walk over the parents, its tokens by one tensor and its parents and depths
        shared by every chain of its length: plain decoding builds one every step, where each torch op was a visible
        share of a one-row step's Python (experiments/onnxruntime_verify)."""
        draft = draft.tolist() if isinstance(draft, torch.Tensor) else list(draft)
        n = len(draft) + 1
        if draft_probs is not None and draft_probs.shape[0] != n:
            raise SpecbenchError(f"TokenTree draft_probs has {draft_probs.shape[0]} rows for {n} nodes")
        tree = cls.__new__(cls)
        tree.tokens, tree.draft_probs = torch.tensor([int(root), *draft], dtype=torch.long), draft_probs
        tree.parents, tree.depths = _chain_index(n)
        tree._chain = True
        return tree

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def is_chain(self) -> bool:
        """A chain's tree mask is the causal mask, so verification can let the model build it."""
        return self._chain

    def first_path(self) -> "TokenTree":
        """The chain from the root through each node's first child (a best-first tree's best-ranked one), with its
        nodes' draft distributions: what a verify that takes chains only checks of this tree."""
        nodes, children = [0], {}
        for i, p in enumerate(self.parents.tolist()[1:], start=1):
            children.setdefault(p, i)
        while nodes[-1] in children:
            nodes.append(children[nodes[-1]])
        probs = None if self.draft_probs is None else self.draft_probs[nodes]
        return TokenTree(self.tokens[nodes], torch.arange(-1, len(nodes) - 1), probs)

    def depth(self) -> int:
        """The deepest node's depth (0 for the root alone)."""
        return len(self) - 1 if self._chain else int(self.depths.max())

    def has_children(self, node: int) -> bool:
        return node < len(self) - 1 if self._chain else bool((self.parents == node).any())

    def children(self, node: int) -> list[int]:
        return (self.parents == node).nonzero().flatten().tolist()

    def ancestor_mask(self) -> torch.Tensor:
        """(n, n) bool: row i is True at i and at every ancestor of i."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):  # parents come first, so the parent's row is complete
            mask[i] |= mask[int(self.parents[i])]
        return mask

    def position_ids(self, past_len: int) -> torch.Tensor:
        return self.depths + past_len

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]


@functools.lru_cache(maxsize=64)
def _chain_index(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain of n nodes' parents and depths, shared by every chain of that length (a TokenTree's index tensors are
    read, never written)."""
    return torch.arange(-1, n - 1), torch.arange(n)
