"""Suffix decoding: the suffix tree's counts and drafts by hand (the Python tree and arctic-inference's, where
installed), draft size following the match length, lossless greedy decoding in fp32, the sampled distribution under
rejection sampling, the global tree on a repeated prompt, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.acceptance import ExactAcceptance
from specbench.acceptance.rejection import RejectionSampling
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.base import DecodeState
from specbench.drafters.suffix import SuffixDrafter, suffix_tree_class
from specbench.drafters.suffix_tree import SuffixTree
from specbench.errors import SpecbenchError
from specbench.sampling import SamplingParams
from specbench.trees.native import NativePolicy

from .test_rejection import (PROMPT, SAMPLES, SAMPLING, TOKENS, RejectionWithoutResidual, exact_distribution,
                             lively_tiny, logits_table, tv_and_bound)
from .test_sssd import FLAT, STEEP, sized_tree_sizes

TEXTS = ["the cat sat on the mat and the cat sat on the hat", "def f(x):\n    return x\n\ndef g(x):\n    return",
         "hello world " * 6]
IMPLEMENTATIONS = [SuffixTree]
try:
    from arctic_inference.suffix_decoding._C import SuffixTree as ArcticSuffixTree

    IMPLEMENTATIONS.append(ArcticSuffixTree)
except ImportError:
    pass


def decode(tiny, drafter, prompt, max_new=48):
    return Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), max_new, tiny.eos_token_ids,
                   max_context=tiny.max_context).generate(prompt)


@pytest.mark.parametrize("tree_class", IMPLEMENTATIONS, ids=lambda c: c.__module__)
def test_counts_and_drafts_by_hand(tree_class):
    """After 1 2 3 1 2 3 1 2 4 1 2: '1 2' occurred 4 times, followed by 3 twice, by 4 once and by nothing once."""
    tree = tree_class(8)
    tree.extend(0, [1, 2, 3, 1, 2, 3])
    tree.extend(0, [1, 2, 4, 1, 2])  # extending a sequence continues it: '3 1 2' spans the two calls
    path = tree.speculate([7, 1, 2], 8, 1.0, 0.0, 0.1, False)  # match '1 2' (2 tokens): up to 2 drafted
    assert path.token_ids == [3, 1] and path.parents == [-1, 0] and path.match_len == 2
    assert path.probs == pytest.approx([0.5, 0.5])
    tree_draft = tree.speculate([7, 1, 2], 8, 2.0, 0.0, 0.1, True)  # up to 4 tokens, best first
    assert tree_draft.token_ids[:3] == [3, 1, 2] and tree_draft.parents[:3] == [-1, 0, 1]
    # the fourth: one of three continuations at 0.25 (4 after '1 2', 3 or 4 after '1 2 3 1 2'); ties are unordered
    assert (tree_draft.token_ids[3], tree_draft.parents[3]) in [(4, -1), (3, 2), (4, 2)]
    assert tree_draft.probs == pytest.approx([0.5, 0.5, 0.5, 0.25]) and tree_draft.score == pytest.approx(1.75)
    assert tree.speculate([7, 1, 2], 8, 2.0, 0.0, 0.3, True).token_ids == [3, 1, 2]  # 4 (0.25) is below 0.3
    assert tree.speculate([9, 9], 8, 1.0, 0.0, 0.1, True).token_ids == []  # nothing matches


@pytest.mark.parametrize("tree_class", IMPLEMENTATIONS, ids=lambda c: c.__module__)
@pytest.mark.parametrize("factor, offset, budget", [(1.0, 0.0, 16), (2.0, 1.0, 16), (1.0, 0.0, 4)])
def test_draft_size_follows_the_match_length(tree_class, factor, offset, budget):
    """A context matching the last k tokens of a sequence drafts min(k * factor + offset, budget - 1) tokens."""
    sequence = list(range(10, 40))
    tree = tree_class(24)
    tree.extend(0, sequence)
    for k in range(1, 8):
        draft = tree.speculate([99, *sequence[10 - k: 10]], budget - 1, factor, offset, 0.1, True)
        want = min(int(k * factor + offset), budget - 1)
        assert draft.match_len == k and draft.token_ids == sequence[10: 10 + want]


@pytest.mark.parametrize("prompt_text", TEXTS)
@pytest.mark.parametrize("knobs", [{}, {"tree_spec": False}, {"max_spec_factor": 3.0, "min_token_prob": 0.0}])
def test_greedy_decoding_is_token_identical_to_plain_decoding(tiny, prompt_text, knobs):
    prompt = tiny.tokenizer(prompt_text)["input_ids"]
    want = decode(tiny, PlainDrafter(), prompt).tokens
    drafter = SuffixDrafter(tiny, NativePolicy(16), **knobs)
    for _ in range(2):  # the second time the global tree holds the first answer
        gen = decode(tiny, drafter, prompt)
        assert gen.tokens == want
    assert max(step.accepted for step in gen.steps) > 0  # it drafted something the target took


@pytest.mark.parametrize("suffix_tree", ["python", "auto"])
def test_a_sized_draft_is_lossless_and_keeps_the_nodes_that_pay(tiny, suffix_tree):
    """Sized (trees/sized.py), the draft is its best-first prefix that pays most on L(n): all of it on a flat L(n),
    less where each row costs 0.6 of a step, the same tokens as plain decoding either way, on either suffix tree."""
    prompts = [tiny.tokenizer(t)["input_ids"] for t in TEXTS] * 2  # the second round finds the first in the global tree

    def make(**sized):
        return SuffixDrafter(tiny, NativePolicy(8), suffix_tree=suffix_tree, **sized)

    unsized = [s.tree_size for p in prompts for s in decode(tiny, make(), p).steps]
    flat, _ = sized_tree_sizes(tiny, make, prompts, FLAT, decode)
    steep, drafter = sized_tree_sizes(tiny, make, prompts, STEEP, decode)
    assert sum(flat) == pytest.approx(sum(unsized), rel=0.2)
    assert sum(steep) / len(steep) < sum(flat) / len(flat) and sum(drafter.sizer.acceptance.judged) > 0


def test_the_global_tree_helps_on_a_repeated_prompt(tiny):
    """The second decode of a prompt finds the first answer in the global tree: its first step is accepted before
    the output has anything to match locally, and it takes fewer steps; without the global tree nothing changes."""
    prompt = tiny.tokenizer(TEXTS[1])["input_ids"]
    runs = {}
    for use_global in (True, False):
        drafter = SuffixDrafter(tiny, NativePolicy(16), use_global=use_global)
        runs[use_global] = [[s.accepted for s in decode(tiny, drafter, prompt, max_new=64).steps] for _ in range(2)]
    assert runs[False][1] == runs[False][0]
    first, second = runs[True]
    assert second[0] > first[0] and len(second) < len(first)


def test_a_warmup_corpus_fills_the_global_tree(tiny, tmp_path):
    prompt = tiny.tokenizer(TEXTS[1])["input_ids"]
    answer = tiny.tokenizer.decode(prompt + decode(tiny, PlainDrafter(), prompt, max_new=64).tokens)
    corpus = tmp_path / "warmup.jsonl"
    corpus.write_text(json.dumps("unrelated text") + "\n" + json.dumps({"text": answer}) + "\n")
    cold = len(decode(tiny, SuffixDrafter(tiny, NativePolicy(16)), prompt, max_new=64).steps)
    warm = len(decode(tiny, SuffixDrafter(tiny, NativePolicy(16), warmup=str(corpus)), prompt, max_new=64).steps)
    assert warm < cold


def suffix_samples(target_table, rule, n: int) -> tuple[torch.Tensor, int]:
    """n draws of the first TOKENS tokens with suffix decoding drafting (its global tree learning from every draw),
    and how many draft tokens were accepted in all."""
    gen = torch.Generator().manual_seed(1234)
    drafter = SuffixDrafter(None, NativePolicy(3), max_spec_factor=2.0, min_token_prob=0.0)
    out, accepted = torch.empty(n, TOKENS, dtype=torch.long), 0
    for i in range(n):
        state = DecodeState(tokens=PROMPT + [SAMPLING.sample(target_table[()], gen)], prompt_len=len(PROMPT))
        drafter.reset(state)
        while len(state.tokens) - len(PROMPT) < TOKENS:
            tree = drafter.propose(state)
            done = tuple(state.tokens[len(PROMPT):])
            logits = torch.stack([target_table[done + tuple(tree.tokens[tree.path_to(node)[1:]].tolist())]
                                  for node in range(len(tree))])
            acc = rule.accept(tree, logits, SAMPLING, gen)
            state.tokens += tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
            accepted += len(acc.path) - 1
        out[i] = torch.tensor(state.tokens[len(PROMPT): len(PROMPT) + TOKENS])
    return out, accepted


@pytest.fixture(scope="module")
def target_table():
    return logits_table(lively_tiny(0).model, TOKENS + 1)


def test_rejection_sampling_keeps_the_target_distribution(target_table):
    samples, accepted = suffix_samples(target_table, RejectionSampling(), SAMPLES)
    tv, bound = tv_and_bound(samples, exact_distribution(target_table))
    assert accepted > SAMPLES / 2, f"only {accepted} draft tokens accepted: the test has no power"
    assert tv < bound, f"TV {tv:.4f} exceeds the bound {bound:.4f} for {SAMPLES} samples"


def test_the_same_test_fails_without_the_residual(target_table):
    samples, _ = suffix_samples(target_table, RejectionWithoutResidual(), SAMPLES)
    tv, bound = tv_and_bound(samples, exact_distribution(target_table))
    assert tv > bound, f"the broken rule passed (TV {tv:.4f} <= bound {bound:.4f}): the test has no power"


@pytest.mark.parametrize("knobs, message", [
    ({"max_depth": 1}, "max_depth=1 is invalid"),
    ({"min_token_prob": 1.5}, "min_token_prob=1.5 is invalid"),
    ({"max_spec_factor": -1}, "max_spec_factor=-1 is invalid"),
    ({"suffix_tree": "rust"}, "suffix_tree='rust' is invalid"),
    ({"use_global": False, "warmup": "x.jsonl"}, "warmup fills the global tree"),
    ({"warmup": "/nonexistent.jsonl"}, "is not a file"),
    ({"sized": "yes"}, "sized='yes' is invalid: it must be true or false"),
])
def test_bad_knobs_are_one_line_errors(tiny, knobs, message):
    with pytest.raises(SpecbenchError, match=message):
        SuffixDrafter(tiny, NativePolicy(16), **knobs)


def test_auto_picks_arctic_inference_where_installed():
    assert suffix_tree_class("auto") is IMPLEMENTATIONS[-1]
    assert suffix_tree_class("python") is SuffixTree
