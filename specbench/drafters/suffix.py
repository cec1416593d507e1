"""Suffix decoding (Oliaro et al. 2024, Snowflake's ArcticInference; vLLM's `suffix` method): training-free drafts
from suffix trees over the current request and over the run's past answers.

Two trees, as in arctic-inference's SuffixDecodingCache:
- a local tree per request over its prompt and the output so far;
- a global tree over every answer of this run (one sequence per request, extended as its tokens are accepted, so
  batched sequences and later requests see them; a warm-up corpus, if given, is in it from the start).
Each step both trees speculate from the last max_depth tokens and the draft whose probabilities sum higher is
verified. A match of k tokens drafts at most k * max_spec_factor + max_spec_offset tokens, so the tree grows with
how much of the context matched, up to tree.budget nodes (root included).

The tree is arctic-inference's own (`pip install 'specbench[suffix]'`) where installed, else the same structure in
Python (specbench.drafters.suffix_tree); `suffix_tree` picks one.
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path

from specbench.drafters.base import DecodeState, Drafter
from specbench.drafters.suffix_tree import SuffixTree as PythonSuffixTree
from specbench.errors import SpecbenchError
from specbench.trees.policy import TreePolicy
from specbench.trees.sized import StepSizer, check_sized
from specbench.trees.token_tree import TokenTree

IMPLEMENTATIONS = ("auto", "arctic", "python")


def suffix_tree_class(implementation: str):
    """The SuffixTree class to use: arctic-inference's C++ tree or the Python one (auto: arctic's when installed)."""
    if implementation not in IMPLEMENTATIONS:
        raise SpecbenchError(f"method.drafter.suffix_tree={implementation!r} is invalid: pick one of "
                             f"{list(IMPLEMENTATIONS)}")
    if implementation == "python":
        return PythonSuffixTree
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError:
        if implementation == "arctic":
            raise SpecbenchError("method.drafter.suffix_tree=arctic needs arctic-inference: `pip install "
                                 "'specbench[suffix]'` (it builds from source with cmake and nanobind), or pick "
                                 "suffix_tree=python") from None
        return PythonSuffixTree
    return SuffixTree


def warmup_documents(path: Path, tokenizer) -> list[list[int]]:
    """A warm-up corpus: a .jsonl file of one text per line (a string, or an object with "text"), else one text."""
    if not path.is_file():
        raise SpecbenchError(f"suffix warmup={str(path)!r} is not a file: give a .jsonl of texts or a text file")
    if path.suffix != ".jsonl":
        return [tokenizer(path.read_text())["input_ids"]]
    texts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            text = row.get("text") if isinstance(row, dict) else row
            if not isinstance(text, str):
                raise SpecbenchError(f"suffix warmup {path} line {n} holds no text: give a JSON string or an object "
                                     f"with a \"text\" string per line")
            texts.append(text)
    return [tokenizer(t)["input_ids"] for t in texts]


class SuffixDrafter(Drafter):
    name = "suffix"
    tree_policies = ("native",)
    drafts_from_tokens = True

    def __init__(self, target, tree: TreePolicy, max_depth: int = 24, max_spec_factor: float = 1.0,
                 max_spec_offset: float = 0.0, min_token_prob: float = 0.1, tree_spec: bool = True,
                 use_global: bool = True, warmup: str | None = None, suffix_tree: str = "auto",
                 sized: bool = False) -> None:
        """Defaults are vLLM's (suffix_decoding_max_tree_depth 24, max_spec_factor 1, min_token_prob 0.1);
        tree_spec=False drafts the single most frequent path, as vLLM does; use_global=False keeps the local tree.
        sized: trim each step's draft to the part that pays most on this machine (trees/sized.py; the run measures
        L(n) and calls fit): its probabilities are count ratios of the trees, which the StepSizer calibrates."""
        self.check_config({"max_depth": max_depth, "max_spec_factor": max_spec_factor,
                           "max_spec_offset": max_spec_offset, "min_token_prob": min_token_prob,
                           "use_global": use_global, "warmup": warmup, "suffix_tree": suffix_tree, "sized": sized})
        self.sized, self.sizer = sized, StepSizer()
        self.tree_class = suffix_tree_class(suffix_tree)
        self.max_depth, self.budget = max_depth, tree.budget
        self.max_spec_factor, self.max_spec_offset, self.min_token_prob = max_spec_factor, max_spec_offset, min_token_prob
        self.tree_spec, self.use_global = bool(tree_spec), bool(use_global)
        self.corpus = [] if warmup is None else warmup_documents(Path(warmup).expanduser(), target.tokenizer)
        self.learns_across_answers = self.use_global or sized
        self.forget()
        self.local_tree, self.seen, self.prompt_len, self.sequence = None, 0, 0, None

    @classmethod
    def check_config(cls, config: dict) -> None:
        """The knobs' ranges, the tree implementation and the warm-up file, before any model loads."""
        max_depth = config["max_depth"]
        if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 2:
            raise SpecbenchError(f"method.drafter.max_depth={max_depth!r} is invalid: it must be an integer >= 2")
        for knob, low in (("max_spec_factor", 0), ("max_spec_offset", None), ("min_token_prob", 0)):
            value = config[knob]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or (low is not None and value < low):
                raise SpecbenchError(f"method.drafter.{knob}={value!r} is invalid: it must be a number"
                                     + (f" >= {low}" if low is not None else ""))
        if config["min_token_prob"] > 1:
            raise SpecbenchError(f"method.drafter.min_token_prob={config['min_token_prob']!r} is invalid: it must be "
                                 f"in [0, 1]")
        suffix_tree_class(config["suffix_tree"])
        check_sized(config.get("sized", False))
        warmup = config["warmup"]
        if warmup is not None and not config["use_global"]:
            raise SpecbenchError("method.drafter.warmup fills the global tree: it needs method.drafter.use_global=true")
        if warmup is not None and not Path(warmup).expanduser().is_file():
            raise SpecbenchError(f"method.drafter.warmup={str(warmup)!r} is not a file: give a .jsonl of texts or a "
                                 f"text file")

    def forget(self) -> None:
        """A global tree of the warm-up corpus alone, and a sized draft's calibration at its prior. The tree is shared
        by the forks a batch makes (batching.fork_drafter copies shallowly): every sequence adds its answer."""
        self.sizer.forget()
        self.global_tree = self.tree_class(self.max_depth) if self.use_global else None
        self.sequence_ids = count()
        for doc in self.corpus:
            self.global_tree.extend(next(self.sequence_ids), doc)

    def reset(self, state: DecodeState) -> None:
        """A fresh local tree and a new sequence in the global one; both are extended as propose sees tokens."""
        self.local_tree, self.seen, self.prompt_len = self.tree_class(self.max_depth), 0, state.prompt_len
        self.sequence = next(self.sequence_ids)
        self.sizer.reset()

    def _extend(self, tokens: list[int]) -> None:
        """Add the tokens accepted since the last step (the decoder grows one list in place)."""
        new = tokens[self.seen:]
        self.local_tree.extend(0, new)
        answer = tokens[max(self.seen, self.prompt_len):]
        if self.global_tree is not None and answer:
            self.global_tree.extend(self.sequence, answer)
        self.seen = len(tokens)

    def propose(self, state: DecodeState) -> TokenTree:
        self._extend(state.tokens)
        context = state.tokens[-self.max_depth:]
        args = (self.budget - 1, self.max_spec_factor, self.max_spec_offset, self.min_token_prob, self.tree_spec)
        draft = self.local_tree.speculate(context, *args)
        if self.global_tree is not None:
            other = self.global_tree.speculate(context, *args)
            draft = draft if draft.score >= other.score else other
        tokens, parents = [state.root, *draft.token_ids], [-1, *(p + 1 for p in draft.parents)]
        n = self.sizer.size(state.tokens, tokens, parents, list(draft.probs))
        return TokenTree(tokens[:n], parents[:n])

    def fit(self, latency_ms) -> None:
        """A sized draft reads L(n) for every size it may pick."""
        if self.sized:
            self.sizer.fit(latency_ms, self.budget)
