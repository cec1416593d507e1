"""The expected-accepted-length tree builder that Medusa (App. C), Ghidorah (ARCA step 1) and SSSD (Alg. 1) share.

Input: accept_prob[d][i], the probability that the i-th ranked candidate at depth d+1 is accepted given its parent
was (measured by specbench.evaluation.calibration, or a paper's per-head accuracies). Under independence a node's path
probability is the product along its path, and its contribution to the expected accepted length is exactly that
product; adding the connected node with the highest product until the budget is reached therefore maximises
tau(n) = 1 + sum of the path probabilities (the 1 is the bonus token). The result is a static tree.
"""

from __future__ import annotations

import heapq
import json
import logging
from pathlib import Path

from omegaconf import ListConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.trees.policy import TreePolicy
from specbench.trees.static import PRESET_DIR, StaticPolicy

log = logging.getLogger(__name__)


def load_accept_prob(source, where: str = "tree.accept_prob") -> list[list[float]]:
    """accept_prob from an inline list, a calibration JSON file, or a preset name in conf/tree/presets; `where`: the
    setting that gave it, which its errors name."""
    if isinstance(source, ListConfig):
        source = OmegaConf.to_container(source)
    if isinstance(source, str):
        path = Path(source).expanduser()
        path = path if path.exists() else PRESET_DIR / f"{source}.json"
        if not path.exists():
            raise SpecbenchError(f"{where}='{source}' is neither a calibration JSON file nor a preset in "
                                 f"{PRESET_DIR}; `python run.py task=calibrate` makes one")
        source = _calibration_table(path, f"{where}='{source}'")
    ok = isinstance(source, list) and source and all(
        isinstance(row, list) and row and all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in row)
        for row in source)
    if not ok:
        raise SpecbenchError(f"{where}={source!r} is invalid: give one non-empty list of probabilities "
                             f"in [0, 1] per depth, e.g. [[0.6, 0.1], [0.3, 0.1]]")
    return source


def _calibration_table(path: Path, given: str):
    """The "accept_prob" of a calibration JSON (what task=calibrate writes), or one line saying what the file is."""
    fix = "give the JSON file `python run.py task=calibrate` writes, or a preset name"
    if path.is_dir():
        raise SpecbenchError(f"{given} is a folder: {fix}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecbenchError(f"{given} cannot be read ({exc.strerror or exc}): {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecbenchError(f"{given} is not JSON ({exc}): {fix}") from None
    if not isinstance(doc, dict) or "accept_prob" not in doc:
        raise SpecbenchError(f"{given} holds no \"accept_prob\" key (one list of probabilities per depth): {fix}")
    return doc["accept_prob"]


def expected_tau(choices: list[list[int]], accept_prob: list[list[float]]) -> float:
    """1 + the sum over nodes of the product of accept_prob along the node's path (ranks outside the table: 0)."""
    total = 1.0
    for path in choices:
        value = 1.0
        for depth, rank in enumerate(path):
            row = accept_prob[depth] if depth < len(accept_prob) else []
            value *= row[rank] if rank < len(row) else 0.0
        total += value
    return total


def greedy_choices(accept_prob: list[list[float]], n: int) -> tuple[list[list[int]], float]:
    """The n-node tree (root included) of highest expected tau, as medusa_choices, and that tau."""
    capacity, width = 0, 1
    for row in accept_prob:
        width *= len(row)
        capacity += width
    if n < 1 or n - 1 > capacity:
        raise SpecbenchError(f"tree.budget={n} is invalid: it counts the root, so it must lie in 1..{capacity + 1} "
                             f"for an accept_prob table of {len(accept_prob)} depths x "
                             f"{[len(r) for r in accept_prob]} ranks")
    frontier = [(-a, (rank,)) for rank, a in enumerate(accept_prob[0])]
    heapq.heapify(frontier)
    chosen, tau = [], 1.0
    while len(chosen) < n - 1:
        neg_value, path = heapq.heappop(frontier)
        chosen.append(list(path))
        tau -= neg_value
        if len(path) < len(accept_prob):
            for rank, a in enumerate(accept_prob[len(path)]):
                heapq.heappush(frontier, (neg_value * a, path + (rank,)))
    return chosen, tau


class GreedyPolicy(StaticPolicy):
    """accept_prob=None: the drafter supplies its own calibration (Medusa's artifact holds its heads' accuracies)
    through with_accept_prob; a drafter without one reports that tree.accept_prob is needed."""

    name = "greedy"

    def __init__(self, budget: int = 16, accept_prob="medusa_vicuna_7b_accuracies") -> None:
        self.accept_prob = None if accept_prob is None else load_accept_prob(accept_prob)
        if self.accept_prob is None:
            TreePolicy.__init__(self, budget)
            self.paths, self.children, self.depth = [], {}, 0
            return
        choices, self.expected_tau = greedy_choices(self.accept_prob, budget)
        super().__init__(choices=choices)
        log.info("greedy tree: %d nodes, expected tau %.3f", budget, self.expected_tau)

    @property
    def accept_table(self) -> list[list[float]] | None:
        """The calibration given in the config (None: the drafter's own)."""
        return self.accept_prob

    def with_accept_prob(self, accept_prob) -> "GreedyPolicy":
        """This budget over the given calibration (kept when the run's tree.accept_prob is set)."""
        return self if self.accept_prob is not None else GreedyPolicy(self.budget, accept_prob)

    def build(self, root, expander):
        if self.accept_prob is None:
            raise SpecbenchError("tree=greedy needs tree.accept_prob (a calibration JSON from `python run.py "
                                 "task=calibrate`, or a preset name) for this method")
        return super().build(root, expander)
