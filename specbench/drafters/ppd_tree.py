"""PPD's dynamic sparse tree (thesis §5.3-5.6), built offline from calibrated per-prompt-token rank accuracies.

State T_k (used after the accepted node carried k prompt tokens) holds the best candidate paths of depth <= k
(f(T_k) = sum of their path probabilities) and gives each candidate 1..m prompt tokens. Starting from m each, the
prompt token whose removal costs least, p_excl(c) * (f(T_i) - f(T_{i-1})) (Prop. 5.6.3), goes first until the
budget fits; the candidate/prompt split maximises the two-step lookahead F(T_k) = f(T_k) + sum_i p(s_i|s_k) f(T_i)
(Prop. 5.6.2). The budget counts every row of the forward: root, candidates and all prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specbench.errors import SpecbenchError
from specbench.trees.greedy import greedy_choices
from specbench.trees.static import StaticPolicy

Path = tuple[int, ...]


@dataclass
class PPDState:
    paths: list[Path]  # candidate rank paths, sorted by (depth, ranks): StaticPolicy's node order, root excluded
    carried: list[int]  # prompt tokens per tree node, root first
    value: float  # F(T_k)
    trans: dict[int, float]  # P(the next state is T_i), i = 1..m: the accepted node carried i prompt tokens

    def rows(self, n_e: int) -> int:
        """Rows of this state's forward: root, candidates and every prompt token."""
        return 1 + len(self.paths) + n_e * sum(self.carried)

    @property
    def policy(self) -> StaticPolicy | None:
        return StaticPolicy(choices=[list(p) for p in self.paths]) if self.paths else None


def path_prob(acc, path: Path) -> float:
    p = 1.0
    for depth, rank in enumerate(path):
        p *= acc[depth][rank]
    return p


def best_paths(acc, n: int, max_depth: int) -> list[Path]:
    capacity, width = 0, 1
    for row in acc[:max_depth]:
        width *= len(row)
        capacity += width
    if n == 0 or n > capacity:
        return [] if n == 0 else None
    return sorted((tuple(p) for p in greedy_choices(acc[:max_depth], n + 1)[0]), key=lambda p: (len(p), p))


def _exclusive(acc, paths: list[Path]) -> list[float]:
    """Probability that each candidate is the deepest accepted node."""
    probs = {p: path_prob(acc, p) for p in paths}
    child_sum = {p: 0.0 for p in paths}
    for p in paths:
        if len(p) > 1:
            child_sum[p[:-1]] += probs[p]
    return [probs[p] - child_sum[p] for p in paths]


def _state(acc, m: int, n_e: int, k: int, budget: int, f: dict[int, float]) -> PPDState | None:
    best = None
    for n_c in range(0, budget):
        prompt_budget = (budget - 1 - m * n_e - n_c) // n_e
        if prompt_budget < n_c:
            break
        paths = best_paths(acc, n_c, k)
        if paths is None:  # no more paths of depth <= k
            break
        excl = _exclusive(acc, paths)
        carried = [m] * n_c
        while sum(carried) > prompt_budget:
            c = min((i for i in range(n_c) if carried[i] > 1),
                    key=lambda i: excl[i] * (f[carried[i]] - f[carried[i] - 1]))
            carried[c] -= 1
        trans = {i: 0.0 for i in range(1, m + 1)}
        for c, e in zip(carried, excl):
            trans[c] += e
        trans[m] += 1.0 - sum(excl)  # only the root accepted: it carries m
        value = sum(path_prob(acc, p) for p in paths) + sum(trans[i] * f[i] for i in trans)
        if best is None or value > best.value:
            best = PPDState(paths, [m] + carried, value, trans)
    return best


def dynamic_sparse_tree(acc: list[list[float]], m: int, budget: int, n_e: int = 1) -> dict[int, PPDState]:
    """States T_1..T_m for a forward of at most `budget` rows."""
    if budget < 1 + m * n_e:
        raise SpecbenchError(f"tree.budget={budget} is too small for PPD: the root and its "
                             f"{m * n_e} prompt tokens already need {1 + m * n_e} rows")
    acc = acc[:m]
    f = {0: 0.0} | {i: 0.0 for i in range(1, m + 1)}
    for _ in range(3):  # f(T_i) and the allocations depend on each other: a few rounds settle them
        states = {k: _state(acc, m, n_e, k, budget, f) for k in range(1, m + 1)}
        f = {0: 0.0} | {k: sum(path_prob(acc, p) for p in s.paths) for k, s in states.items()}
    return states


def step_rate(acc, states: dict[int, PPDState], n_e: int, latency_ms: Callable[[int], float]) -> tuple[float, float]:
    """(tau, ms per step) in the long run: the states visited as often as the chain T_k -> T_i of their transition
    probabilities settles (its stationary distribution), tau = 1 + the accepted candidates expected there, and the
    step's cost L(rows) of the state it is in."""
    share = {k: 1.0 / len(states) for k in states}
    for _ in range(200):
        share = {i: sum(share[k] * s.trans[i] for k, s in states.items()) for i in states}
    tau = 1.0 + sum(share[k] * sum(path_prob(acc, p) for p in s.paths) for k, s in states.items())
    return tau, sum(share[k] * latency_ms(s.rows(n_e)) for k, s in states.items())


def hardware_aware_budget(acc: list[list[float]], m: int, n_e: int, max_budget: int,
                          latency_ms: Callable[[int], float]) -> tuple[int, dict[int, float]]:
    """The thesis's hardware-aware size n* = argmax tau(n) / L(n) over budgets up to max_budget, n counting every
    row PPD verifies (candidates and prompt tokens); returns n* and tau/L (tokens per ms) per budget."""
    smallest = 1 + m * n_e
    if max_budget < smallest:
        raise SpecbenchError(f"tree.budget={max_budget} is too small for PPD: the root and its {m * n_e} prompt "
                             f"tokens already need {smallest} rows")
    rates = {}
    for n in range(smallest, max_budget + 1):
        tau, ms = step_rate(acc[:m], dynamic_sparse_tree(acc, m, n, n_e), n_e, latency_ms)
        rates[n] = tau / ms
    return max(rates, key=rates.get), rates
