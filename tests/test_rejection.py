"""Rejection sampling is lossless: its first sampled tokens follow the target's plain distribution exactly.

A tiny random target and a noisy copy of it as draft, both over an 8-token vocabulary. The exact distribution of the
first three tokens under plain sampling is enumerated from the target's logits. Speculative samples use the
real tree policies, child sampling and acceptance rule; the target and draft distributions of every context they can
reach are precomputed in one batched forward, so thousands of samples take seconds. The test statistic is the total
variation distance between the empirical and the exact distribution; its bound follows from the sample count N:
E[TV] <= 1/2 sum_i sqrt(p_i / N), and TV exceeds its mean by t with probability <= exp(-2 N t^2) (McDiarmid), so a
correct rule fails with probability below 1e-6. The same test must fail when the residual correction is removed. That the real draft-model drafter records
the q it sampled from is checked in test_draft_model.py.
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from specbench.acceptance.exact import ExactAcceptance
from specbench.acceptance.rejection import RejectionSampling
from specbench.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.models import tiny_random
from specbench.execution.backends import with_backend
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.static import StaticPolicy

VOCAB, PROMPT, TOKENS, SAMPLES = 8, [1, 5, 2, 7], 3, 3000
SAMPLING = SamplingParams(temperature=1.0)
FAILURE_PROB = 1e-6


def lively_tiny(seed: int, sharpness: float = 3.0):
    """tiny_random with an untied embedding and LM head, so its next token depends on the context, not a fixed point."""
    loaded = tiny_random(num_layers=2, vocab_size=VOCAB, seed=seed)
    torch.manual_seed(seed)
    model, hidden = loaded.model, loaded.model.config.hidden_size
    model.model.embed_tokens = torch.nn.Embedding(VOCAB, hidden)
    model.lm_head = torch.nn.Linear(hidden, VOCAB, bias=False)
    torch.nn.init.normal_(model.lm_head.weight, std=sharpness / hidden ** 0.5)
    return loaded


def noisy_copy(loaded, noise: float, seed: int = 1):
    draft = copy.deepcopy(loaded)
    torch.manual_seed(seed)
    with torch.no_grad():
        draft.model.lm_head.weight.add_(noise * torch.randn_like(draft.model.lm_head.weight) / 8 ** 0.5)
    draft.name = "noisy_draft"
    return draft


def logits_table(model, depth: int) -> dict[tuple[int, ...], torch.Tensor]:
    """Logits after PROMPT + s for every suffix s of length 0..depth, from one batched forward."""
    suffixes = list(itertools.product(range(VOCAB), repeat=depth))
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + list(s) for s in suffixes])).logits.float()
    table = {}
    for row, s in enumerate(suffixes):
        for j in range(depth + 1):
            table[s[:j]] = logits[row, len(PROMPT) - 1 + j]
    return table


@pytest.fixture(scope="module")
def tables():
    target = lively_tiny(0)
    draft = noisy_copy(target, noise=1.5)
    return logits_table(target.model, TOKENS + 1), logits_table(draft.model, TOKENS + 1)


class TableDrafter:
    """A draft model read from the precomputed table: the DraftExpander a policy grows its tree with."""

    def __init__(self, draft_table, generator):
        self.table, self.generator = draft_table, generator

    def expand(self, tree, nodes):
        return torch.stack([SAMPLING.probs(self.table[self.context + tuple(tree.path_tokens(n))]) for n in nodes])


def speculative_samples(target_table, draft_table, policy, rule, stochastic: bool, n: int) -> torch.Tensor:
    """n draws of the first TOKENS tokens: the first from the prefill logits, the rest from speculative steps."""
    gen = torch.Generator().manual_seed(1234)
    drafter = TableDrafter(draft_table, gen if stochastic else None)
    out = torch.empty(n, TOKENS, dtype=torch.long)
    for i in range(n):
        tokens = [SAMPLING.sample(target_table[()], gen)]
        while len(tokens) < TOKENS:
            drafter.context = tuple(tokens)
            tree = policy.build(tokens[-1], drafter)
            logits = torch.stack([target_table[tuple(tokens) + tuple(tree.tokens[tree.path_to(node)[1:]].tolist())]
                                  for node in range(len(tree))])
            acc = rule.accept(tree, logits, SAMPLING, gen)
            tokens += tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
        out[i] = torch.tensor(tokens[:TOKENS])
    return out


def exact_distribution(target_table) -> torch.Tensor:
    """P(first TOKENS tokens) under plain sampling, flattened over VOCAB**TOKENS sequences."""
    probs = torch.empty(VOCAB ** TOKENS)
    for idx, seq in enumerate(itertools.product(range(VOCAB), repeat=TOKENS)):
        probs[idx] = math.prod(float(SAMPLING.probs(target_table[seq[:j]])[seq[j]]) for j in range(TOKENS))
    return probs


def tv_and_bound(samples: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    n = samples.shape[0]
    flat = (samples * VOCAB ** torch.arange(TOKENS - 1, -1, -1)).sum(1)
    empirical = torch.bincount(flat, minlength=exact.numel()).float() / n
    tv = 0.5 * float((empirical - exact).abs().sum())
    bound = 0.5 * float(exact.sqrt().sum()) / math.sqrt(n) + math.sqrt(math.log(1 / FAILURE_PROB) / (2 * n))
    return tv, bound


class RejectionWithoutResidual(RejectionSampling):
    """The classic bug: after a rejection, resample from p instead of the residual."""

    @staticmethod
    def residual(p, q):
        return p


STATIC = [[0], [1], [0, 0], [0, 1], [1, 0]]
CASES = {
    "chain, sampled draft (Leviathan)": (ChainPolicy(budget=3), True),
    "tree, sampled siblings (SpecInfer)": (StaticPolicy(choices=STATIC), True),
    "chain, deterministic draft (PLD-like)": (ChainPolicy(budget=3), False),
    "tree, deterministic top-k": (StaticPolicy(choices=STATIC), False),
    "dynamic tree (EAGLE-2)": (DynamicPolicy(budget=5, top_k=2, depth=2), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rejection_matches_plain_decoding_distribution(tables, case):
    target_table, draft_table = tables
    policy, stochastic = CASES[case]
    samples = speculative_samples(target_table, draft_table, policy, RejectionSampling(), stochastic, SAMPLES)
    tv, bound = tv_and_bound(samples, exact_distribution(target_table))
    assert tv < bound, f"{case}: TV {tv:.4f} exceeds the bound {bound:.4f} for {SAMPLES} samples"


@pytest.mark.parametrize("backend", ["prepacked", "compile"])
@pytest.mark.slow
def test_rejection_matches_plain_decoding_distribution_on_the_fast_backends(backend):
    """The same test with both tables computed by the target and draft run on a fast execution backend."""
    target = lively_tiny(0)
    draft = noisy_copy(target, noise=1.5)
    target_table = logits_table(with_backend(target, backend).model, TOKENS + 1)
    draft_table = logits_table(with_backend(draft, backend).model, TOKENS + 1)
    policy, stochastic = CASES["dynamic tree (EAGLE-2)"]
    samples = speculative_samples(target_table, draft_table, policy, RejectionSampling(), stochastic, SAMPLES)
    tv, bound = tv_and_bound(samples, exact_distribution(target_table))
    assert tv < bound, f"{backend}: TV {tv:.4f} exceeds the bound {bound:.4f} for {SAMPLES} samples"


@pytest.mark.parametrize("case", ["tree, sampled siblings (SpecInfer)", "tree, deterministic top-k"])
def test_the_same_test_fails_without_the_residual(tables, case):
    target_table, draft_table = tables
    policy, stochastic = CASES[case]
    samples = speculative_samples(target_table, draft_table, policy, RejectionWithoutResidual(), stochastic, SAMPLES)
    tv, bound = tv_and_bound(samples, exact_distribution(target_table))
    assert tv > bound, f"{case}: the broken rule passed (TV {tv:.4f} <= bound {bound:.4f}): the test has no power"


def test_rejection_is_exact_greedy_at_temperature_zero(tables):
    target_table, draft_table = tables
    greedy = SamplingParams()
    drafter = TableDrafter(draft_table, None)
    drafter.context = ()
    tree = StaticPolicy(choices=STATIC).build(3, drafter)
    logits = torch.stack([target_table[tuple(tree.tokens[tree.path_to(n)[1:]].tolist())] for n in range(len(tree))])
    for seed in range(5):
        got = RejectionSampling().accept(tree, logits, greedy, torch.Generator().manual_seed(seed))
        want = ExactAcceptance().accept(tree, logits, greedy)
        assert (got.path, got.next_token) == (want.path, want.next_token)


def test_rejection_declares_lossless():
    assert RejectionSampling.lossless is True


@pytest.mark.parametrize("kwargs, message", [({"temperature": -0.1}, "temperature=-0.1 is invalid"),
                                             ({"temperature": 0.7, "top_p": 0.0}, "top_p=0.0 is invalid"),
                                             ({"temperature": 0.7, "top_p": 1.5}, "top_p=1.5 is invalid")])
def test_bad_sampling_params_are_refused(kwargs, message):
    with pytest.raises(SpecbenchError, match=message):
        SamplingParams(**kwargs)
