"""tree=hardware_aware: the greedy expected-length tree at the budget n* = argmax tau(n) / (L(n) + D(tree(n))).

tau(n) is the expected accepted length of the best n-node tree under a calibration (greedy.py: the greedy builder
adds nodes in decreasing path probability, so its first n - 1 nodes are the best n-node tree), L(n) the cost of
one n-token forward: measured on this machine (the machine profile) or the roofline of a board one projects to, and
D the drafter's own cost of drafting that tree, which a drafter measures and reports (`draft_ms`; a draft head that
runs once per tree level, as EAGLE's, pays for depth that L(n) does not see). Without one, D = 0.
This is PPD's hardware-aware tree size, Ghidorah's ARCA width and EAGLE's auto-size, in one place.

Where the rate is nearly flat, n* is the smallest size within NEAR_TIE of the best rate rather than the argmax: the
calibration's error grows with the tree (each node's probability is a product down its path) and errs high for deep
nodes, so a near-tie is a tie the smaller tree, with less drafting, wins in practice
(experiments/openvino_row_invariant).
"""

from __future__ import annotations

import logging
from typing import Callable

from specbench.errors import SpecbenchError
from specbench.trees.greedy import GreedyPolicy, expected_tau, greedy_choices, load_accept_prob

log = logging.getLogger(__name__)


DraftMs = Callable[[list[list[int]]], float]  # ms one step of drafting a static tree of these paths costs
NEAR_TIE = 0.05  # a rate this close to the best one is a tie, which the smaller tree takes


def best_budget(accept_prob: list[list[float]], latency_ms: Callable[[int], float], max_budget: int,
                draft_ms: DraftMs | None = None) -> tuple[int, dict[int, float]]:
    """n* in 2..max_budget (capped by the table's capacity): the smallest n whose rate tau(n) / (L(n) + D(n)) is
    within NEAR_TIE of the best, and that rate per n (tokens per ms)."""
    capacity, width = 1, 1
    for row in accept_prob:
        width *= len(row)
        capacity += width
    top = min(max_budget, capacity)
    choices, _ = greedy_choices(accept_prob, top)
    rate = {n: expected_tau(choices[: n - 1], accept_prob)
            / (latency_ms(n) + (draft_ms(choices[: n - 1]) if draft_ms else 0.0)) for n in range(2, top + 1)}
    best = max(rate.values())
    return min(n for n, r in rate.items() if r >= (1 - NEAR_TIE) * best), rate


class HardwareAwarePolicy(GreedyPolicy):
    """tree.budget caps n*; after fitting, budget is n*. Needs a latency curve (fit) before it builds;
    accept_prob=None takes the drafter's own (Medusa's artifact); draft_ms: the drafter's cost (fit)."""

    name = "hardware_aware"

    def __init__(self, budget: int = 64, accept_prob=None, latency_ms: Callable[[int], float] | None = None,
                 draft_ms: DraftMs | None = None) -> None:
        if not isinstance(budget, int) or budget < 2:
            raise SpecbenchError(f"tree.budget={budget!r} is invalid: give an integer >= 2 (root included), the "
                                 f"largest tree hardware_aware may pick")
        self.max_budget, self.latency_ms, self.draft_ms, self.rates = budget, latency_ms, draft_ms, {}
        table = None if accept_prob is None else load_accept_prob(accept_prob)
        if table is None or latency_ms is None:
            GreedyPolicy.__init__(self, budget, None)  # unbuilt until both are known
            self._table = table
            return
        best, self.rates = best_budget(table, latency_ms, budget, draft_ms)
        GreedyPolicy.__init__(self, best, table)
        self._table = table
        top = max(self.rates, key=self.rates.get)
        log.info("hardware-aware tree: n* = %d, %.4f tokens/ms (tau/(L + drafting) over n = 2..%d; %s)%s", best,
                 self.rates[best], budget, "drafting as the drafter measured it" if draft_ms else "no drafting cost",
                 f"; the best rate, {self.rates[top]:.4f} at n = {top}, is within {NEAR_TIE:.0%}: a near-tie, "
                 f"which the smaller tree takes" if top != best else "")

    @property
    def accept_table(self) -> list[list[float]] | None:
        """The calibration given in the config (None: the drafter's own)."""
        return self._table

    def fit(self, latency_ms: Callable[[int], float], draft_ms: DraftMs | None = None) -> "HardwareAwarePolicy":
        """This policy sized for a latency curve L(n) in ms and the drafter's measured cost of drafting a tree."""
        return HardwareAwarePolicy(self.max_budget, self._table, latency_ms, draft_ms)

    def with_accept_prob(self, accept_prob) -> "HardwareAwarePolicy":
        if self._table is not None:
            return self
        return HardwareAwarePolicy(self.max_budget, accept_prob, self.latency_ms, self.draft_ms)

    def build(self, root, expander):
        if self.latency_ms is None:
            raise SpecbenchError("tree=hardware_aware has no latency curve: the evaluator fits it from the machine "
                                 "profile (eval.dtype=auto or eval.fastest_plain=true) or the hw roofline")
        return super().build(root, expander)
