"""docs/ARCHITECTURE.md's recipe for adding a drafter, followed by a toy one that lives only in this file: the
evaluation plans, decodes, fits, prices and summarises it through the Drafter contract, with no edit anywhere else.

The toy drafts a chain that repeats the last token (a bigram guess any text makes sometimes), from the tree policy's
budget; it declares a cost (one extra LM-head read per step, as a Medusa head would), so the roofline prices it,
and it sizes its chain from L(n) when asked to fit.
"""

from __future__ import annotations

import json

import pytest

from specbench.drafters.base import DecodeState, Drafter, DrafterCost
from specbench.tasks import eval as eval_task
from specbench.trees.token_tree import TokenTree

from .conftest import compose_cfg

RUN = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=12", "eval.warmup=0",
       "eval.memory_probe=false", "eval.fastest_plain=false", "eval.first_turn_only=true", "~logger"]


class RepeatDrafter(Drafter):
    """Drafts tree.budget - 1 copies of the root token; fit() shrinks the chain where L(n) grows steeply."""

    name = "repeat"
    tree_policies = ("native", "hardware_aware")
    fitted_with: list = []

    def __init__(self, target, tree, copies: int | None = None) -> None:
        self.copies = copies if copies is not None else tree.budget - 1

    def propose(self, state: DecodeState) -> TokenTree:
        return TokenTree.chain(state.root, [state.root] * self.copies)

    def cost(self) -> DrafterCost:
        return DrafterCost(medusa_heads=1)

    def fit(self, latency_ms) -> None:
        RepeatDrafter.fitted_with.append(latency_ms(1))
        self.copies = 1 if latency_ms(4) > 2 * latency_ms(1) else self.copies


def test_a_drafter_defined_outside_the_package_runs_through_the_whole_evaluation(tmp_path):
    target = f"{__name__}.RepeatDrafter"
    overrides = [*RUN, "method=pld", f"method.name=repeat", f"~method.drafter",
                 f"+method.drafter._target_={target}", "tree.budget=4"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path), overrides)
    row = summary.set_index("method").loc["repeat"]
    assert row["lossless_match"] == 1.0  # exact acceptance: whatever it drafts, the tokens are plain decoding's
    assert row["mean_tree_size"] == 4.0 and row["tau"] >= 1.0
    assert row["projected_speedup"] > 0  # priced by the roofline with the cost it declared
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert {r["method"] for r in records} == {"plain", "repeat"}


@pytest.mark.slow
def test_its_cost_changes_the_roofline_projection(tmp_path):
    """The declared cost is what the summary prices: without it the same drafter projects faster."""
    target = f"{__name__}.RepeatDrafter"
    base = [*RUN, "method=pld", "method.name=repeat", "~method.drafter", f"+method.drafter._target_={target}",
            "tree.budget=4"]
    priced = eval_task.run(compose_cfg(base, tmp_path / "a"), base).set_index("method").loc["repeat"]
    free = Drafter.cost
    try:
        RepeatDrafter.cost = free
        unpriced = eval_task.run(compose_cfg(base, tmp_path / "b"), base).set_index("method").loc["repeat"]
    finally:
        del RepeatDrafter.cost
    assert unpriced["projected_speedup"] * priced["tau"] > priced["projected_speedup"] * unpriced["tau"]


@pytest.mark.parametrize("hw", ["cpu", "jetson"])
@pytest.mark.slow
def test_hardware_aware_hands_the_drafter_the_machines_or_the_boards_latency(hw, tmp_path):
    """tree=hardware_aware: the plan calls Drafter.fit with L(n), measured here (hw=cpu, the machine profile) or
    the board's roofline (jetson)."""
    RepeatDrafter.fitted_with = []
    target = f"{__name__}.RepeatDrafter"
    overrides = [*RUN, f"hw={hw}", "method=pld", "method.name=repeat", "~method.drafter",
                 f"+method.drafter._target_={target}", "tree=hardware_aware", "tree.budget=4"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path), overrides)
    assert len(RepeatDrafter.fitted_with) == 1 and RepeatDrafter.fitted_with[0] > 0
    assert summary.set_index("method").loc["repeat", "lossless_match"] == 1.0
