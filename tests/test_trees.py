"""Tree policies: static (medusa_choices), greedy expected-length builder, EAGLE-2 dynamic; their errors."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from specbench.errors import SpecbenchError
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.greedy import GreedyPolicy, expected_tau, greedy_choices, load_accept_prob
from specbench.trees.hardware_aware import HardwareAwarePolicy
from specbench.trees.sized import ScoreAcceptance, StepSizer
from specbench.trees.static import PRESET_DIR, StaticPolicy, cartesian_choices

VOCAB = 32


class FixedDraft:
    """A drafter whose distribution after a path is a fixed function of the path: easy to reason about."""

    def __init__(self, generator=None):
        self.generator, self.calls = generator, []

    def expand(self, tree, nodes):
        self.calls.append(list(nodes))
        rows = []
        for node in nodes:
            seed = hash(tuple(tree.path_tokens(node))) % 10_000
            logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2
            rows.append(logits.softmax(-1))
        return torch.stack(rows)


def ranked(draft, tree, node):
    """The tokens after node's path, best first."""
    return draft.expand(tree, [node])[0].argsort(descending=True).tolist()


def test_medusa_preset_builds_the_64_node_tree_level_by_level():
    policy = StaticPolicy(preset="mc_sim_7b_63")
    draft = FixedDraft()
    tree = policy.build(7, draft)
    assert len(tree) == 64 == len(policy) and int(tree.depths.max()) == 4
    parents_per_level = [len({tuple(p[:d]) for p in policy.paths if len(p) == d + 1}) for d in range(4)]
    assert [len(c) for c in draft.calls] == parents_per_level == [1, 10, 10, 1]  # one draft call per level
    assert tree.draft_probs is None
    paths = {tuple(tree.tokens[tree.path_to(n)[1:]].tolist()) for n in range(1, len(tree))}
    top = FixedDraft().expand  # [0, 2]: the root's best token, then the third best after it
    first = int(top(_grown([7]), [0])[0].argmax())
    third_after = int(top(_grown([7, first]), [1])[0].argsort(descending=True)[2])
    assert (first, third_after) in paths


def _grown(tokens):
    from specbench.trees.policy import GrowingTree

    tree = GrowingTree.rooted(tokens[0])
    for i, token in enumerate(tokens[1:]):
        tree.add(i, token, 0.0)
    return tree


def test_static_tree_with_sampling_records_q_only_where_ranks_are_a_prefix_of_the_draws():
    tree = StaticPolicy(choices=[[0], [1], [0, 0], [0, 2]]).build(3, FixedDraft(torch.Generator().manual_seed(0)))
    assert tree.draft_probs is not None
    assert tree.draft_probs[0].sum() == pytest.approx(1.0)  # root: children are draws 1 and 2
    node_0 = tree.children(0)[0]
    assert tree.draft_probs[node_0].sum() == 0  # ranks {0, 2}: not the first draws, so deterministic


@pytest.mark.parametrize("choices, message", [
    ([], "non-empty list of paths"),
    ([[0], [0, 1, 2]], r"path \[0, 1, 2\] has no parent: add its prefix \[0, 1\]"),
    ([[0], [-1]], "ranks >= 0"),
    ([[0], [0]], "twice"),
    ([[0], 3], "path #1 = 3 is invalid"),
])
def test_invalid_medusa_choices_are_refused(choices, message):
    with pytest.raises(SpecbenchError, match=message):
        StaticPolicy(choices=choices)


def test_static_needs_exactly_one_source_and_a_known_preset():
    with pytest.raises(SpecbenchError, match="exactly one"):
        StaticPolicy()
    with pytest.raises(SpecbenchError, match="exactly one"):
        StaticPolicy(choices=[[0]], preset="mc_sim_7b_63")
    with pytest.raises(SpecbenchError, match="known preset.*mc_sim_7b_63"):
        StaticPolicy(preset="no_such_tree")


MEDUSA = load_accept_prob("medusa_vicuna_7b_accuracies")


def cartesian_shapes(nodes: int, max_width: int, max_depth: int):
    """Every widths list whose Cartesian tree has exactly `nodes` draft nodes."""
    for depth in range(1, max_depth + 1):
        for widths in itertools.product(range(1, max_width + 1), repeat=depth):
            if len(cartesian_choices(list(widths))) == nodes:
                yield list(widths)


def test_greedy_64_node_tree_beats_every_cartesian_tree_of_the_same_size_on_medusa_accuracies():
    choices, tau = greedy_choices(MEDUSA, 64)
    assert len(choices) == 63 and tau == pytest.approx(expected_tau(choices, MEDUSA))
    shapes = list(cartesian_shapes(63, max_width=len(MEDUSA[0]), max_depth=len(MEDUSA)))
    assert shapes, "there are Cartesian trees of 63 draft nodes to compare with"
    best_cartesian = max(expected_tau(cartesian_choices(w), MEDUSA) for w in shapes)
    assert tau > best_cartesian


def test_greedy_is_optimal_among_all_small_trees():
    table = [[0.5, 0.2, 0.1], [0.4, 0.3], [0.6]]
    all_paths = [list(p) for d in range(1, 4) for p in itertools.product(*(range(len(r)) for r in table[:d]))]
    for n in range(1, 7):
        _, tau = greedy_choices(table, n)
        best = 1.0
        for subset in itertools.combinations(all_paths, n - 1):
            chosen = {tuple(p) for p in subset}
            if all(len(p) == 1 or p[:-1] in chosen for p in chosen):
                best = max(best, expected_tau(list(subset), table))
        assert tau == pytest.approx(best)


def test_greedy_policy_reads_a_calibration_file_and_reports_tau(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"accept_prob": [[0.7, 0.1], [0.5, 0.2]]}))
    policy = GreedyPolicy(budget=4, accept_prob=str(path))
    assert policy.expected_tau == pytest.approx(1 + 0.7 + 0.35 + 0.14)
    assert len(policy.build(1, FixedDraft())) == 4


@pytest.mark.parametrize("n, message", [(0, "tree.budget=0 is invalid"), (10_000, "must lie in 1..")])
def test_greedy_budget_must_be_possible(n, message):
    with pytest.raises(SpecbenchError, match=message):
        GreedyPolicy(budget=n)


def test_greedy_refuses_a_malformed_table():
    with pytest.raises(SpecbenchError, match="accept_prob"):
        GreedyPolicy(budget=4, accept_prob=[[1.5]])
    with pytest.raises(SpecbenchError, match="neither a calibration JSON"):
        GreedyPolicy(budget=4, accept_prob="missing_calibration")


def test_dynamic_tree_keeps_the_best_nodes_by_cumulative_log_probability():
    draft = FixedDraft()
    policy = DynamicPolicy(budget=9, top_k=3, depth=3)
    tree = policy.build(5, draft)
    assert len(tree) == 9 and int(tree.depths.max()) <= 3
    assert [len(c) for c in draft.calls] == [1, 3, 3]  # top_k frontier nodes expanded per level
    assert tree.draft_probs is None
    # the kept nodes are the 8 best of all 3 + 9 + 9 candidates by cumulative log-probability
    score = _path_scores(DynamicPolicy(budget=101, top_k=3, depth=3).build(5, FixedDraft()))
    kept = {tuple(tree.tokens[tree.path_to(n)[1:]].tolist()) for n in range(1, len(tree))}
    assert kept == set(sorted(score, key=score.get, reverse=True)[:8])


def _path_scores(tree) -> dict[tuple[int, ...], float]:
    """Every node's path below the root and its cumulative log-probability under FixedDraft."""
    score = {}
    for n in range(1, len(tree)):
        path = tree.tokens[tree.path_to(n)[1:]].tolist()
        score[tuple(path)] = sum(
            float(FixedDraft().expand(_grown([5] + path[:i]), [i])[0][path[i]].log()) for i in range(len(path)))
    return score


def test_a_small_dynamic_budget_drafts_no_level_it_cannot_keep_and_keeps_the_same_nodes():
    """budget - 1 kept nodes closed under ancestors lie at most budget - 1 deep: deeper levels are not drafted, and
    the nodes kept are still the best of the tree grown to the full depth."""
    draft = FixedDraft()
    tree = DynamicPolicy(budget=3, top_k=3, depth=5).build(5, draft)
    assert len(draft.calls) == 2
    score = _path_scores(DynamicPolicy(budget=101, top_k=3, depth=5).build(5, FixedDraft()))
    kept = {tuple(tree.tokens[tree.path_to(n)[1:]].tolist()) for n in range(1, len(tree))}
    assert max(len(p) for p in score) == 5 and kept == set(sorted(score, key=score.get, reverse=True)[:2])


@pytest.mark.parametrize("knob", ["top_k", "depth"])
def test_dynamic_knobs_must_be_positive(knob):
    with pytest.raises(SpecbenchError, match=f"tree.{knob}=0 is invalid"):
        DynamicPolicy(**{knob: 0})


def test_chain_samples_when_the_drafter_samples_and_records_q():
    firsts = set()
    for seed in range(10):
        tree = ChainPolicy(budget=4).build(2, FixedDraft(torch.Generator().manual_seed(seed)))
        assert tree.draft_probs is not None and len(tree) == 4
        firsts.add(int(tree.tokens[1]))
    assert len(firsts) > 1
    greedy = ChainPolicy(budget=4).build(2, FixedDraft())
    assert greedy.draft_probs is None and int(greedy.tokens[1]) == ranked(FixedDraft(), _grown([2]), 0)[0]


def test_presets_are_valid_medusa_choices():
    for path in PRESET_DIR.glob("*.json"):
        if not path.stem.endswith("_accuracies"):
            StaticPolicy(preset=path.stem)


def test_calibration_of_a_perfect_draft_accepts_rank_0_always(tiny, tmp_path):
    from specbench.drafters.draft_model import DraftModelDrafter
    from specbench.evaluation.calibration import calibrate, probe_tree

    drafter = DraftModelDrafter(tiny, probe_tree(depth=3, ranks=4), early_exit_layers=2)  # all layers: the target
    calibration = calibrate(tiny.model, drafter, [[5, 9, 14, 99], [140, 77, 3]], depth=3, ranks=4, max_new_tokens=12)
    assert all(t > 0 for row in calibration.trials for t in row)
    assert calibration.accept_prob == [[1.0, 0.0, 0.0, 0.0]] * 3
    saved = json.loads(calibration.save(tmp_path / "c.json", drafter="draft_model").read_text())
    assert GreedyPolicy(budget=4, accept_prob=str(tmp_path / "c.json")).expected_tau == pytest.approx(4.0)
    assert saved["trials"] == calibration.trials


def test_calibration_counts_each_rank_of_the_accepted_parent():
    from specbench.evaluation.calibration import Calibration
    from specbench.trees.token_tree import TokenTree

    tree = TokenTree(torch.tensor([0, 4, 5, 6, 7]), torch.tensor([-1, 0, 0, 2, 2]))  # root -> (4, 5); 5 -> (6, 7)
    logits = torch.zeros(5, 8)
    logits[0, 5] = logits[2, 7] = logits[4, 1] = 1  # the target says 5, then 7, then 1
    calibration = Calibration(depth=2, ranks=2)
    calibration.record(tree, [0, 2, 4], logits)
    assert calibration.hits == [[0, 1], [0, 1]] and calibration.trials == [[1, 1], [1, 1]]


def test_task_calibrate_writes_the_json_tree_greedy_reads(tmp_path):
    from specbench.tasks import dispatch
    from specbench.trees.greedy import GreedyPolicy

    from .conftest import compose_cfg

    out = tmp_path / "cal.json"
    cfg = compose_cfg(["task=calibrate", "model=tiny_random", "method=draft_model", "method.checkpoint=null",
                       "method.draft.early_exit_layers=1",
                       "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8",
                       "+calibration.depth=2", "+calibration.ranks=3", f"+calibration.out={out}"], tmp_path)
    dispatch(cfg)
    assert GreedyPolicy(budget=4, accept_prob=str(out)).expected_tau >= 1.0


def test_hardware_aware_budget_maximises_expected_tau_per_forward_cost():
    acc = [[0.8, 0.1], [0.6, 0.1], [0.5, 0.1]]
    choices, _ = greedy_choices(acc, 8)
    flat = HardwareAwarePolicy(budget=8, accept_prob=acc, latency_ms=lambda n: 10.0)  # wider is free
    # tau(n) grows to 2.81 at 8 nodes; 6 nodes reach 2.70, within 5% of it: a near-tie, which the smaller tree takes
    assert flat.rates[6] >= 0.95 * flat.rates[8] > flat.rates[5] and flat.budget == 6
    steep = HardwareAwarePolicy(budget=8, accept_prob=acc, latency_ms=lambda n: 10.0 * n)  # each node costs one
    # tau(2)/L(2) = 1.8/20 beats every wider tree (tau(3) = 2.28 over 30, ...): the root plus one node
    assert steep.budget == 2
    mid = HardwareAwarePolicy(budget=8, accept_prob=acc, latency_ms=lambda n: 30.0 + 2.0 * n)
    by_hand = {n: expected_tau(choices[: n - 1], acc) / (30.0 + 2.0 * n) for n in range(2, 9)}
    near = [n for n, rate in by_hand.items() if rate >= 0.95 * max(by_hand.values())]
    assert mid.budget == min(near) and mid.rates == pytest.approx(by_hand)
    assert len(mid.build(1, FixedDraft())) == mid.budget


def test_hardware_aware_gives_a_near_tie_to_the_smaller_tree_and_says_so(caplog):
    """EAGLE's shape on the w4a8r CPU target (experiments/openvino_row_invariant): a rate flat from 2 to 8 nodes, where
    the calibration's optimism about deep nodes decides the argmax; the smaller tree takes the tie."""
    acc = [[0.5, 0.1], [0.7, 0.1], [0.75, 0.1]]
    with caplog.at_level("INFO", logger="specbench.trees.hardware_aware"):
        flat = HardwareAwarePolicy(budget=8, accept_prob=acc, latency_ms=lambda n: 20.0 + 0.3 * n)
        steep = HardwareAwarePolicy(budget=8, accept_prob=acc, latency_ms=lambda n: 10.0 * n)
    first, second = (r.getMessage() for r in caplog.records)
    top = max(flat.rates, key=flat.rates.get)
    assert flat.budget < top and flat.rates[flat.budget] >= 0.95 * flat.rates[top]
    assert all(flat.rates[n] < 0.95 * flat.rates[top] for n in range(2, flat.budget))
    assert f"n* = {flat.budget}," in first and f"at n = {top}, is within 5%: a near-tie" in first
    assert steep.budget == 2 and "near-tie" not in second


def test_hardware_aware_waits_for_a_curve_and_a_calibration():
    unfit = HardwareAwarePolicy(budget=16)
    with pytest.raises(SpecbenchError, match="no latency curve"):
        unfit.build(1, FixedDraft())
    fitted = unfit.fit(lambda n: 5.0 + n).with_accept_prob([[0.9, 0.05], [0.8, 0.05]])  # Medusa's path
    assert 2 <= fitted.budget <= 7 and len(fitted.build(1, FixedDraft())) == fitted.budget
    with pytest.raises(SpecbenchError, match="tree.budget=1 is invalid"):
        HardwareAwarePolicy(budget=1)


def test_a_step_sizer_judges_every_candidate_against_the_answer_drafted_or_trimmed():
    """A candidate was right if the target's tokens after its root are its path; one the answer has not yet reached
    waits; a trimmed candidate counts as a drafted one (judged on drafted nodes alone, a score whose first nodes
    failed would never be drafted, so never measured, again)."""
    sizer = StepSizer()
    answer = [1, 2]
    sizer.pending = [(len(answer), [[5], [5, 6], [7], [5, 6, 8]], [0, 1, 2, 3])]
    sizer.judge(answer + [5])  # [7] was wrong; [5] right; the deeper two wait
    judged, accepted = sizer.acceptance.judged, sizer.acceptance.accepted
    assert judged[:4] == [1, 0, 1, 0] and accepted[:4] == [1, 0, 0, 0]
    sizer.judge(answer + [5, 6, 9])
    assert judged[:4] == [1, 1, 1, 1] and accepted[:4] == [1, 1, 0, 0]
    assert sizer.pending == []


def test_a_step_sizer_keeps_every_node_until_fit_and_then_the_nodes_that_pay():
    sizer = StepSizer()
    tokens, parents, scores = [9, 5, 6, 7], [-1, 0, 1, 0], [0.9, 0.8, 0.2]
    assert sizer.size([1, 9], tokens, parents, scores) == 4 and sizer.pending == []  # not fit: no sizing, no learning
    sizer.fit(lambda n: 10.0 + 2.0 * (n - 1), budget=4)  # a row costs a fifth of a step
    assert sizer.size([1, 9], tokens, parents, scores) == 3  # the 0.2 node is worth less than a fifth of a step
    assert [paths for _, paths, _ in sizer.pending] == [[[5], [5, 6], [7]]]


def test_score_acceptance_moves_from_the_score_to_the_measured_rate():
    acceptance = ScoreAcceptance()
    bucket = ScoreAcceptance.bucket(0.5)
    assert ScoreAcceptance.bucket(1.0) == 0 and ScoreAcceptance.bucket(1e-30) == ScoreAcceptance.bucket(1e-20)
    assert 0.4 < acceptance.expected(bucket) < 0.6
    acceptance.record([bucket] * 100, [False] * 100)
    assert acceptance.expected(bucket) < 0.02
    acceptance.record([bucket] * 1000, [True] * 1000)
    assert acceptance.expected(bucket) > 0.9
