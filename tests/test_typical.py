"""Typical acceptance: Medusa's threshold rule, longest path with likelihood tie-break, greedy bonus, lossy label."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.acceptance.typical import TypicalAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.errors import SpecbenchError
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.token_tree import TokenTree

V = 6


def logits_for(*rows):
    """Logits whose softmax at temperature 1 is exactly the given rows."""
    return torch.tensor(rows, dtype=torch.float).clamp_min(1e-12).log()


def threshold(p, eps=0.09, delta=0.3):
    p = torch.tensor(p)
    entropy = -(p * torch.log(p + 1e-5)).sum()
    return min(eps, delta * math.exp(-float(entropy)))


def test_accepts_tokens_above_the_entropy_threshold_and_picks_the_longest_path():
    root = [0.5, 0.3, 0.1, 0.05, 0.05, 0.0]
    assert 0.05 < threshold(root) < 0.3  # min(0.09, 0.3 e^-H) = 0.087
    # root children: token 1 (p .3, accepted) and token 3 (p .05, rejected); node 1 has child token 2
    tree = TokenTree(torch.tensor([4, 1, 3, 2]), torch.tensor([-1, 0, 0, 1]))
    after_1 = [0.1, 0.1, 0.6, 0.1, 0.1, 0.0]
    logits = logits_for(root, after_1, root, [0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    acc = TypicalAcceptance().accept(tree, logits, SamplingParams(temperature=1.0))
    assert acc.path == [0, 1, 3] and acc.next_token == 5  # bonus: the argmax at the last accepted node


def test_ties_in_length_go_to_the_higher_likelihood_path():
    root = [0.4, 0.35, 0.25, 0.0, 0.0, 0.0]
    tree = TokenTree(torch.tensor([0, 1, 0]), torch.tensor([-1, 0, 0]))  # tokens 1 (p .35) and 0 (p .4)
    acc = TypicalAcceptance().accept(tree, logits_for(root, root, root), SamplingParams(temperature=1.0))
    assert acc.path == [0, 2]


def test_a_flat_distribution_lowers_the_threshold():
    flat = [1 / V] * V  # H = log 6, so the threshold is 0.3 / 6 = 0.05 < eps: every token passes
    assert threshold(flat) == pytest.approx(0.05, rel=1e-3)
    tree = TokenTree.chain(0, [3])
    acc = TypicalAcceptance().accept(tree, logits_for(flat, flat), SamplingParams(temperature=1.0))
    assert acc.accepted == 1
    acc = TypicalAcceptance(eps=0.5, delta=0.9).accept(tree, logits_for(flat, flat), SamplingParams(temperature=1.0))
    assert acc.accepted == 1  # 1/6 > min(0.5, 0.9/6)
    acc = TypicalAcceptance(eps=0.5, delta=1.2).accept(tree, logits_for(flat, flat), SamplingParams(temperature=1.0))
    assert acc.accepted == 0  # 1/6 < min(0.5, 1.2/6)


def test_temperature_zero_is_exact_greedy_acceptance():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        n = 12
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        tree = TokenTree(torch.randint(0, V, (n,), generator=gen), torch.tensor(parents))
        logits = torch.randn(n, V, generator=gen) * 3
        got = TypicalAcceptance().accept(tree, logits, SamplingParams())
        want = ExactAcceptance().accept(tree, logits, SamplingParams())
        assert got.accepted == want.accepted and got.next_token == want.next_token


def test_decoding_with_typical_at_temperature_zero_equals_greedy(tiny):
    prompt = [5, 9, 14, 99, 140, 77]
    want = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 24).generate(prompt)
    drafter = DraftModelDrafter(tiny, DynamicPolicy(budget=7, top_k=2, depth=3), early_exit_layers=1)
    got = Decoder(tiny.model, drafter, TypicalAcceptance(), SamplingParams(), 24).generate(prompt)
    assert got.tokens == want.tokens


def test_typical_is_declared_lossy():
    assert TypicalAcceptance.lossless is False


@pytest.mark.parametrize("kwargs, message", [({"eps": 0.0}, "accept.eps=0.0 is invalid"),
                                             ({"delta": -1.0}, "accept.delta=-1.0 is invalid")])
def test_bad_thresholds_are_refused(kwargs, message):
    with pytest.raises(SpecbenchError, match=message):
        TypicalAcceptance(**kwargs)
