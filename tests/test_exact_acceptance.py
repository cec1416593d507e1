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


def test_greedy_tokens_is_torch_argmax_with_ties_nan_and_views():
    """The numpy argmax the decode loop takes on a CPU gives torch.argmax's choice: the first of equal maxima, a NaN
    as the maximum, on a 1D row, rows, a strided view, and a non-float32 tensor (torch's own)."""
    from specbench.sampling import greedy_tokens

    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    logits[1, 7] = logits[1, 30] = logits[1].max() + 1  # a tie: the first wins
    logits[2, 11] = float("nan")
    logits[3] = 0.0
    for case in (logits, logits[0], logits[:, ::2], logits.T, logits.double()):
        assert torch.equal(greedy_tokens(case), case.argmax(-1))
    assert greedy_tokens(logits)[1] == 7 and greedy_tokens(logits)[2] == 11
