"""SSSD (Simply-Scalable Speculative Decoding): a training-free tree drafted from n-gram counts of two sources.

- input: the prompt plus the output so far, indexed by n-grams of length 1..input_max_prefix. Every match length
  gives its own count trie of what followed the context's last n tokens (the paper's one tree per match length).
- datastore: a suffix array over ShareGPT (specbench.data.datastore); the last datastore_max_prefix tokens, then
  shorter suffixes until min_count matches, `samples` continuations spread over each match range, merged.

A candidate's pseudo-probability is count(prefix + path) / count(prefix). It is discounted by
    input_discount * match_discount ** (input_max_prefix - k)   for the input, k = the match length
    depth_discount ** (depth - 1)                                for both sources
and the tree is grown best first up to tree.budget nodes, merging equal tokens under the same parent (Algorithm 1).

sized=true fits each step's tree to this machine, as the paper's "when speculation pays" asks per batch
(trees/sized.py): its scores are count ratios, which a StepSizer calibrates against the answers as they grow.
The paper grid-searched its discounts and gives no values. input_discount is 1 here, chosen by task=replay on held-out
ShareGPT answers of SmolLM2-135M (experiments/sssd_knobs: tau 2.46 -> 2.55 at 4 nodes, 3.38 -> 3.44 at 8, against
0.5); the other knobs moved tau by about as much as the drafting time they cost, so they keep their first values.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from itertools import count
from pathlib import Path

from specbench.data.datastore import TrieNode, count_trie, load_or_build, spread
from specbench.drafters.base import DecodeState, Drafter
from specbench.errors import SpecbenchError
from specbench.trees.policy import TreePolicy
from specbench.trees.sized import StepSizer, check_sized
from specbench.trees.token_tree import TokenTree

SOURCES = ("input", "datastore")


class InputIndex:
    """Where every n-gram (n = 1..max_prefix) of the prompt + output occurred: the positions right after it."""

    def __init__(self, max_prefix: int) -> None:
        self.max_prefix, self.tokens, self.seen = max_prefix, [], 0
        self.follows: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def extend(self, tokens: list[int]) -> None:
        """Index the tokens past the ones already seen (tokens must extend the indexed sequence; the decoder grows
        one list in place, so the count of indexed tokens is kept apart from it)."""
        for t in range(self.seen, len(tokens)):
            for n in range(1, min(self.max_prefix, t + 1) + 1):
                self.follows[tuple(tokens[t - n + 1: t + 1])].append(t + 1)
        self.tokens, self.seen = tokens, len(tokens)

    def lookup(self, k: int, depth: int, samples: int) -> tuple[int, dict[int, TrieNode]]:
        """(occurrences of the last k tokens that something followed, count trie of up to depth following tokens)."""
        tokens = self.tokens
        starts = [p for p in self.follows.get(tuple(tokens[-k:]), ()) if p < len(tokens)]
        starts = [starts[i] for i in spread(len(starts), samples)]
        return len(starts), count_trie(tokens[p: p + depth] for p in starts)


class SSSDDrafter(Drafter):
    name = "sssd"
    tree_policies = ("native",)
    drafts_from_tokens = True

    def __init__(self, target, tree: TreePolicy, sources: list[str] = SOURCES, datastore: str | None = None,
                 input_max_prefix: int = 4, datastore_max_prefix: int = 8, min_count: int = 10, samples: int = 100,
                 branch_len: int = 8, input_discount: float = 1.0, match_discount: float = 0.8,
                 depth_discount: float = 0.9, sized: bool = False) -> None:
        """datastore: the index file; None takes task=datastore's default path for this model. sized: trim each
        step's tree to the size that pays most on this machine (the run measures L(n) and calls fit)."""
        sources = list(sources) if isinstance(sources, Sequence) and not isinstance(sources, str) else sources
        if (not isinstance(sources, list) or not sources or len(set(sources)) != len(sources)
                or not set(sources) <= set(SOURCES)):
            raise SpecbenchError(f"sssd sources={sources!r} is invalid: give a non-empty list of distinct names "
                                 f"from {list(SOURCES)}")
        for knob, value in [("input_max_prefix", input_max_prefix), ("datastore_max_prefix", datastore_max_prefix),
                            ("min_count", min_count), ("samples", samples), ("branch_len", branch_len)]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecbenchError(f"sssd {knob}={value!r} is invalid: it must be an integer >= 1")
        for knob, value in [("input_discount", input_discount), ("match_discount", match_discount),
                            ("depth_discount", depth_discount)]:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
                raise SpecbenchError(f"sssd {knob}={value!r} is invalid: it must be a number in (0, 1]")
        check_sized(sized, "sssd sized")
        self.sources, self.budget, self.sized, self.sizer = sources, tree.budget, sized, StepSizer()
        self.learns_across_answers = sized  # what a score's acceptance is (Evaluator._relearn)
        self.input_max_prefix, self.datastore_max_prefix = input_max_prefix, datastore_max_prefix
        self.min_count, self.samples, self.branch_len = min_count, samples, branch_len
        self.input_discount, self.match_discount, self.depth_discount = input_discount, match_discount, depth_discount
        self.store = None
        if "datastore" in sources:
            self.store = load_or_build(Path(datastore).expanduser() if datastore else None, target.tokenizer,
                                       target.name, bool(target.chat_template))
        self.index = InputIndex(input_max_prefix)

    def forget(self) -> None:
        self.sizer.forget()

    def fit(self, latency_ms) -> None:
        """A sized tree reads L(n) for every size it may pick."""
        if self.sized:
            self.sizer.fit(latency_ms, self.budget)

    def reset(self, state: DecodeState) -> None:
        """A fresh input index per prompt; the prompt is indexed here, the output as propose sees it grow. What the
        acceptance of a score is stays learned across prompts."""
        self.index = InputIndex(self.input_max_prefix)
        self.sizer.reset()
        if "input" in self.sources:
            self.index.extend(state.tokens)

    def candidates(self, tokens: list[int]) -> list[tuple[float, dict[int, TrieNode], int]]:
        """(scale, trie, total) per source tree: a node's score is scale * count / total * depth discount."""
        out = []
        # a tree of `budget` nodes reaches depth budget - 1 at most, so deeper continuations are never read: not
        # collecting them leaves the tree as it was and the tries smaller (the draft of a 4-node tree read 8 deep)
        depth = min(self.branch_len, self.budget - 1)
        if "input" in self.sources:
            self.index.extend(tokens)  # the tokens accepted since the last step
            for k in range(1, min(self.input_max_prefix, len(tokens)) + 1):
                total, trie = self.index.lookup(k, depth, self.samples)
                if trie:
                    scale = self.input_discount * self.match_discount ** (self.input_max_prefix - k)
                    out.append((scale, trie, total))
        if self.store is not None:
            total, trie = self.store.lookup(tokens, self.datastore_max_prefix, self.min_count, self.samples, depth)
            if trie:
                out.append((1.0, trie, total))
        return out

    def propose(self, state: DecodeState) -> TokenTree:
        """Best first over every source's trie (Algorithm 1): pop the best-scoring node, add its token under its draft
        parent unless that parent already has it, push its children. Sized, the first nodes that pay (StepSizer)."""
        tokens, parents, scores = [state.root], [-1], []
        child_of: dict[tuple[int, int], int] = {}
        heap, tie = [], count()  # tie: equal scores pop in push order, never comparing tries
        for scale, trie, total in self.candidates(state.tokens):
            for token, node in trie.items():
                heapq.heappush(heap, (-scale * node.count / total, next(tie), token, node, 1, scale, total, 0))
        while heap and len(tokens) < self.budget:
            score, _, token, node, depth, scale, total, parent = heapq.heappop(heap)
            draft = child_of.get((parent, token))
            if draft is None:
                draft = child_of[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                scores.append(-score)
            weight = scale * self.depth_discount ** depth / total
            for child_token, child in node.children.items():
                heapq.heappush(heap, (-weight * child.count, next(tie), child_token, child, depth + 1, scale, total,
                                      draft))
        n = self.sizer.size(state.tokens, tokens, parents, scores)
        tokens, parents = tokens[:n], parents[:n]
        return TokenTree(tokens, parents)
