"""The suffix tree suffix decoding speculates from, with arctic-inference's interface and semantics, in Python.

arctic-inference (Snowflake's ArcticInference, the `suffix` extra) ships this tree in C++ (path-compressed, nodes
kept sorted by count) but only as a source distribution whose build needs cmake, nanobind and grpc-tools; where it
is not installed the drafter uses this one, so suffix decoding runs on any machine. The semantics are the same:

- extend(seq_id, tokens) appends tokens to sequence seq_id and inserts every suffix of it up to max_depth tokens,
  so the node for a string w counts the occurrences of w in all the sequences;
- speculate(context, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec) matches the
  context's last k tokens for every k = 1 .. len(context) - 1 and, for each match, drafts up to
  min(max_spec_tokens, k * max_spec_factor + max_spec_offset) tokens: a token's probability is the product of
  count(child) / count(parent) along its path, a tree is grown best first (or the most frequent path followed)
  while it stays >= min_token_prob, and the draft whose probabilities sum highest wins (a longer match on ties).

Uncompressed (one node per token), so extending costs O(max_depth) per token; ties between equally frequent
continuations go to the one seen first, where arctic-inference's order may differ.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from itertools import count


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


@dataclass
class Draft:
    """arctic-inference's Draft: token_ids[i]'s parent is token_ids[parents[i]] (-1: the context's last token)."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node()
        self._open: dict[int, deque[_Node]] = {}  # per sequence: the nodes its unfinished suffixes end at

    def num_seqs(self) -> int:
        return len(self._open)

    def extend(self, seq_id: int, tokens) -> None:
        suffixes = self._open.setdefault(seq_id, deque())
        for token in tokens:
            suffixes.append(self.root)  # the suffix that starts at this token
            for i, node in enumerate(suffixes):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += 1
                suffixes[i] = child
            if len(suffixes) == self.max_depth:  # the oldest suffix is as deep as the tree goes
                suffixes.popleft()

    def _match(self, context) -> _Node | None:
        node = self.root
        for token in context:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float,
                  min_token_prob: float, use_tree_spec: bool) -> Draft:
        best = Draft()
        context = list(context)
        for match_len in range(1, len(context)):
            node = self._match(context[-match_len:])
            if node is None:
                break  # a longer suffix cannot match where this one does not
            limit = max(0, min(max_spec_tokens, int(match_len * max_spec_factor + max_spec_offset + 1e-6)))
            draft = (self._tree if use_tree_spec else self._path)(node, limit, min_token_prob)
            if draft.score >= best.score:
                best, best.match_len = draft, match_len
        return best

    @staticmethod
    def _path(node: _Node, limit: int, min_prob: float) -> Draft:
        """Follow the most frequent continuation."""
        draft, prob = Draft(), 1.0
        while len(draft.token_ids) < limit and node.children:
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            prob *= child.count / node.count
            if prob < min_prob:
                break
            draft.parents.append(len(draft.token_ids) - 1)
            draft.token_ids.append(token)
            draft.probs.append(prob)
            draft.score += prob
            node = child
        return draft

    @staticmethod
    def _tree(node: _Node, limit: int, min_prob: float) -> Draft:
        """Best first: pop the most probable continuation not yet drafted, draft it, offer its children."""
        draft, tie = Draft(), count()
        heap = [(-child.count / node.count, next(tie), token, child, -1) for token, child in node.children.items()]
        heapq.heapify(heap)
        while heap and len(draft.token_ids) < limit:
            neg_prob, _, token, child, parent = heapq.heappop(heap)
            if -neg_prob < min_prob:
                break
            index = len(draft.token_ids)
            draft.token_ids.append(token)
            draft.parents.append(parent)
            draft.probs.append(-neg_prob)
            draft.score -= neg_prob
            for grand_token, grand in child.children.items():
                heapq.heappush(heap, (neg_prob * grand.count / child.count, next(tie), grand_token, grand, index))
        return draft
