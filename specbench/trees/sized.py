"""A tree sized per step on this machine's L(n) (`method.drafter.sized=true`): of a drafter's best-first tree, the
first n nodes whose expected accepted tokens per ms is highest, n = 1 (no draft) included. A verify's rows are not
free on a CPU, and a step whose guesses are weak pays for rows it will not keep (experiments/openvino_engine_speed).

A drafter whose scores are count ratios (SSSD, suffix decoding) has them calibrated by a StepSizer, which learns per
score bucket how often a candidate was what the target went on to write; one whose scores are already learned
acceptance probabilities (the hybrid's) calls paying_size directly.
"""

from __future__ import annotations

import math
from typing import Callable

from specbench.errors import SpecbenchError

SCORE_BUCKETS = 24  # a node's score in (2 ** -((b + 1) / 2), 2 ** -(b / 2)] falls in bucket b, the last holding the rest
PRIOR_JUDGED = 2.0  # a bucket's first guess, its own score, weighs as this many judged candidates


def check_sized(value, key: str = "method.drafter.sized") -> None:
    """One line for a `sized` knob that is not a bool (every drafter that sizes per step takes it)."""
    if not isinstance(value, bool):
        raise SpecbenchError(f"{key}={value!r} is invalid: it must be true or false")


def paying_size(accept: list[float], step_ms: list[float]) -> int:
    """The node count n (root included, n = 1 a plain step) whose expected accepted tokens per ms,
    (1 + accept[0] + ... + accept[n - 2]) / step_ms[n - 1], is highest: `accept` the probability that each node of a
    best-first tree lies on the accepted path (a parent before its children, so every first n nodes are a tree),
    step_ms L(1), L(2), ... The smaller tree takes a tie."""
    best, best_rate, expected = 1, 1.0 / step_ms[0], 1.0
    for n, p in enumerate(accept[: len(step_ms) - 1], start=2):
        expected += p
        if expected / step_ms[n - 1] > best_rate:
            best, best_rate = n, expected / step_ms[n - 1]
    return best


class ScoreAcceptance:
    """How often a candidate of each score bucket was what the target wrote: the acceptance a sized tree expects of
    a node, starting from its score and moving to the run's measured rate as the answers grow."""

    def __init__(self) -> None:
        self.judged, self.accepted = [0] * SCORE_BUCKETS, [0] * SCORE_BUCKETS

    @staticmethod
    def bucket(score: float) -> int:
        return min(SCORE_BUCKETS - 1, int(-2 * math.log2(min(max(score, 1e-12), 1.0))))

    def expected(self, bucket: int) -> float:
        guess = 2 ** -((bucket + 0.5) / 2)
        return (self.accepted[bucket] + PRIOR_JUDGED * guess) / (self.judged[bucket] + PRIOR_JUDGED)

    def record(self, buckets: list[int], kept: list[bool]) -> None:
        for bucket, on_path in zip(buckets, kept):
            self.judged[bucket] += 1
            self.accepted[bucket] += on_path


class StepSizer:
    """Sizes a drafter's scored tree each step, once `fit` has given it L(n); until then it keeps every node. What it
    learned stays across answers (the drafter's forget drops it)."""

    def __init__(self) -> None:
        self.step_ms: list[float] | None = None  # L(n) for n = 1..budget
        self.forget()

    def fit(self, latency_ms: Callable[[int], float], budget: int) -> None:
        self.step_ms = [latency_ms(n) for n in range(1, budget + 1)]

    def forget(self) -> None:
        self.acceptance, self.pending = ScoreAcceptance(), []  # candidates not yet judged, per step

    def reset(self) -> None:
        """A new answer: the last one's unjudged candidates are dropped."""
        self.pending = []

    def size(self, answer: list[int], tokens: list[int], parents: list[int], scores: list[float]) -> int:
        """How many of the best-first tree's nodes (tokens[0] the root; scores, one per other node) to verify, the
        answer so far ending at the root."""
        if self.step_ms is None:
            return len(tokens)
        buckets = [ScoreAcceptance.bucket(score) for score in scores]
        self.judge(answer)
        self.pending.append((len(answer), _paths(tokens, parents), buckets))
        return paying_size([self.acceptance.expected(b) for b in buckets], self.step_ms)

    def judge(self, answer: list[int]) -> None:
        """Score the candidates of earlier steps against the answer as it has grown: a candidate was right if the
        target's tokens after its root are its path. Every candidate counts, drafted or trimmed, so a score the
        trees stopped drafting keeps being measured (judged on drafted nodes alone, a score that failed early would
        never be drafted again)."""
        waiting = []
        for start, paths, buckets in self.pending:
            known, undecided = answer[start:], []
            for path, bucket in zip(paths, buckets):
                if len(path) > len(known) and path[: len(known)] == known:
                    undecided.append((path, bucket))
                else:
                    self.acceptance.record([bucket], [known[: len(path)] == path])
            if undecided:
                waiting.append((start, *map(list, zip(*undecided))))
        self.pending = waiting


def _paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Each non-root node's tokens from the root's child down to it."""
    paths = [[]]
    for token, parent in zip(tokens[1:], parents[1:]):
        paths.append(paths[parent] + [token])
    return paths[1:]
