"""Exact acceptance with sampling (sample-and-match) must emit tokens with the target's distribution."""

import math

import torch

from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.trees import TokenTree


def tv_bound(samples: int, support: int, fail_prob: float = 1e-4) -> float:
    """Total-variation deviation an empirical distribution stays under with prob 1 - fail_prob (DKW-style
    union bound: each of `support` cells deviates by more than eps with prob <= 2 exp(-2 n eps^2))."""
    eps = math.sqrt(math.log(2 * support / fail_prob) / (2 * samples))
    return support * eps / 2


def test_emitted_tokens_follow_the_target_distribution():
    vocab, n = 6, 20_000
    gen = torch.Generator().manual_seed(0)
    # root -> children with tokens 0, 1; child 0 -> grandchild 2
    tree = TokenTree(torch.tensor([5, 0, 1, 2]), torch.tensor([-1, 0, 0, 1]))
    logits = torch.randn(len(tree), vocab, generator=gen)
    sampling = SamplingParams(temperature=1.0)
    p = sampling.probs(logits)
    first = torch.zeros(vocab)
    second_after_0 = torch.zeros(vocab)
    rule = ExactAcceptance()
    for _ in range(n):
        acc = rule.accept(tree, logits, sampling, gen)
        emitted = tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
        first[emitted[0]] += 1
        if emitted[0] == 0:
            second_after_0[emitted[1]] += 1
    assert (first / n - p[0]).abs().sum() / 2 < tv_bound(n, vocab)
    m = int(second_after_0.sum())
    assert (second_after_0 / m - p[1]).abs().sum() / 2 < tv_bound(m, vocab)
