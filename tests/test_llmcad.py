"""LLMCad (issue 12): fp32 greedy output equals plain decoding with drafts accepted, the tree keeps the
branching threshold, the children cap and the budget, the pacer and the trigger follow the paper, alpha follows a
worked example, bad input ends in one clear line, and the memory-budget projection reads a summary row."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hydra.utils import instantiate

from specbench.acceptance import ExactAcceptance
from specbench.config import build
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.llmcad import LLMCadDrafter
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter
from specbench.hardware.modelled import llmcad
from specbench.models.shape import named_shape
from specbench.sampling import SamplingParams
from specbench.trees.llmcad import LLMCadPolicy

from .conftest import compose_cfg
from .test_draft_model import PROMPTS, lively_tiny, noisy_copy


class FixedDraft:
    """The same draft distribution after every node: confidences are known, so is the tree."""

    def __init__(self, probs: list[float], vocab: int = 8):
        self.probs = torch.zeros(vocab)
        self.probs[: len(probs)] = torch.tensor(probs)
        self.calls: list[list[int]] = []

    def expand(self, tree, nodes):
        self.calls.append(list(nodes))
        return self.probs.expand(len(nodes), -1).clone()


def confidences(tree, probs: torch.Tensor) -> list[float]:
    """Each node's path confidence: the product of the draft probabilities of its tokens."""
    return [math.prod(float(probs[int(tree.tokens[n])]) for n in tree.path_to(node)[1:]) for node in range(len(tree))]


def leaves(tree) -> list[int]:
    return [n for n in range(len(tree)) if not tree.children(n)]


# The tree


def test_candidates_above_the_threshold_branch_and_the_top_one_always_extends():
    tree = LLMCadPolicy(budget=12, alpha=1e-9).build(5, FixedDraft([0.38, 0.31, 0.29, 0.02]))
    assert len(tree) == 12
    for node in range(len(tree)):
        kids = tree.tokens[tree.children(node)].tolist()
        assert kids in ([], [0, 1], [0]), kids  # top-1 and the 0.31 candidate; [0] only where the budget cut
    assert sum(len(tree.children(n)) == 1 for n in range(len(tree))) <= 1
    # "above": a candidate exactly at the threshold does not branch (binary fractions, exact in float32)
    tree = LLMCadPolicy(budget=12, branch_threshold=0.25, alpha=1e-9).build(5, FixedDraft([0.5, 0.25, 0.25]))
    assert all(len(tree.children(n)) <= 1 for n in range(len(tree))) and int(tree.depths.max()) == 11


def test_a_node_has_at_most_max_children():
    draft = FixedDraft([0.2, 0.2, 0.2, 0.2, 0.2])
    tree = LLMCadPolicy(budget=20, branch_threshold=0.1, alpha=1e-9).build(5, draft)
    counts = [len(tree.children(n)) for n in range(len(tree))]
    assert max(counts) == 3 and len(tree) == 20
    tree = LLMCadPolicy(budget=20, branch_threshold=0.1, max_children=2, alpha=1e-9).build(5, draft)
    assert max(len(tree.children(n)) for n in range(len(tree))) == 2


@pytest.mark.parametrize("budget", [2, 3, 7, 16])
def test_the_budget_caps_the_nodes_root_included(budget):
    tree = LLMCadPolicy(budget=budget, alpha=1e-9).build(5, FixedDraft([0.4, 0.35, 0.25]))
    assert len(tree) == budget


def test_the_pacer_extends_the_branch_with_the_largest_shortfall():
    # Confidences 0.6 / 0.4 after every node. Root -> a (node 1, 0.6) and b (node 2, 0.4): shortfalls
    # 2*0.6-1 = 0.2 vs -0.2, expand a -> a1 (3), a' (4). Then 4*0.36-2, 4*0.4-1, 4*0.24-1 = -0.56, 0.6, -0.04:
    # expand b -> b1 (5), b' (6). Then 6*C - T over (a1, b1, a', b') = 0.16, -0.56, 0.44, -0.04: expand a'.
    draft = FixedDraft([0.6, 0.4])
    LLMCadPolicy(budget=9, alpha=1e-9).build(5, draft)
    assert draft.calls == [[0], [1], [2], [4]]


@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.1])
def test_drafting_stops_when_the_best_branch_falls_below_alpha(alpha):
    probs = [0.6, 0.4]
    draft = FixedDraft(probs)
    tree = LLMCadPolicy(budget=64, alpha=alpha).build(5, draft)
    conf = confidences(tree, draft.probs)
    assert len(tree) < 64 and max(conf[n] for n in leaves(tree)) < alpha
    last = tree.children(draft.calls[-1][0])  # the tree before the last draft step still had a branch >= alpha
    before = [n for n in range(len(tree)) if n not in last]
    assert max(conf[n] for n in before if not any(c in before for c in tree.children(n))) >= alpha


def test_a_confident_draft_fills_the_budget_and_a_doubtful_one_verifies_after_one_step():
    assert len(LLMCadPolicy(budget=10, alpha=0.01).build(5, FixedDraft([0.97, 0.03]))) == 10
    draft = FixedDraft([0.2] * 5)
    tree = LLMCadPolicy(budget=10, alpha=0.5).build(5, draft)
    assert draft.calls == [[0]] and len(tree) == 2  # top-1 only: 0.2 is not above 0.3


# alpha


def test_alpha_follows_the_worked_example_of_eq3():
    policy = LLMCadPolicy(alpha=0.01)
    assert policy.update(n_all=4, n_correct=4, after_error=[]) == pytest.approx(0.005)  # all correct: halve
    assert policy.update(n_all=3, n_correct=3, after_error=[]) == pytest.approx(0.0025)
    assert policy.update(n_all=5, n_correct=2, after_error=[0.1, 0.05, 0.01]) == pytest.approx(0.6)  # 3 of 5 wrong
    assert policy.update(n_all=2, n_correct=2, after_error=[]) == pytest.approx(0.3)
    assert policy.update(n_all=4, n_correct=0, after_error=[0.5, 0.2, 0.1, 0.05]) == pytest.approx(1.0)


def test_alpha_prose_rule_divides_by_the_mean_confidence_after_the_error():
    policy = LLMCadPolicy(alpha=0.01, alpha_rule="prose")
    assert policy.update(5, 2, [0.2, 0.1, 0.06]) == pytest.approx(0.01 / 0.12)
    assert policy.update(3, 3, []) == pytest.approx(0.01 / 0.24)
    assert policy.update(4, 1, [1e-3, 1e-4, 1e-5]) == 1.0  # capped: 1 already verifies after every draft step


def test_alpha_reads_the_branch_that_owns_the_last_accepted_node():
    # budget 7 under confidences 0.6/0.4: root 0 -> a 1, b 2; a -> a1 3, a' 4; b -> b1 5, b' 6.
    policy = LLMCadPolicy(budget=7, alpha=0.01)
    tree = policy.build(5, FixedDraft([0.6, 0.4]))
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2, 2]
    policy.observe(tree, [0, 2])  # b accepted, then b1 (its branch: b, b1) wrong: 1 of 2 wrong
    assert policy.alpha == pytest.approx(0.5)
    policy.observe(tree, [0, 1, 4])  # a' is a leaf: a whole branch accepted
    assert policy.alpha == pytest.approx(0.25)
    policy.observe(tree, [0])  # nothing accepted: the main branch (a, a1) was wrong from its first token
    assert policy.alpha == pytest.approx(1.0)
    assert policy.alpha_history == [0.01]  # one build: the alpha it was drafted under


# The drafter


@pytest.fixture(scope="module")
def target():
    return lively_tiny()


@pytest.fixture(scope="module")
def greedy_outputs(target):
    decoder = Decoder(target.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 36)
    return [decoder.generate(prompt).tokens for prompt in PROMPTS]


@pytest.mark.parametrize("method, threshold, rule", [("llmcad", 0.3, "eq3"), ("llmcad", 0.1, "prose"),
                                                     ("draft_model", 0.3, "eq3")])
def test_fp32_greedy_output_equals_plain_decoding_and_drafts_are_accepted(target, greedy_outputs, method, threshold,
                                                                          rule):
    cls = LLMCadDrafter if method == "llmcad" else DraftModelDrafter
    policy = LLMCadPolicy(budget=8, branch_threshold=threshold, alpha_rule=rule)
    drafter = cls(target, policy, draft_model=noisy_copy(target))
    steps, alphas = [], set()
    for prompt, want in zip(PROMPTS, greedy_outputs):
        got = Decoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 36).generate(prompt)
        assert got.tokens == want
        steps += got.steps
        assert len(policy.alpha_history) == len(got.steps) and policy.alpha_history[0] == 0.01
        alphas |= set(policy.alpha_history)
    assert max(s.accepted for s in steps) >= 2, "drafts must be accepted"
    assert any(s.accepted < s.tree_depth for s in steps), "and rolled back"
    assert any(s.tree_size > s.tree_depth + 1 for s in steps), "the trees must branch"
    assert len(alphas) > 1, "alpha must adapt across steps"
    if method == "llmcad":
        assert drafter.alpha_history is policy.alpha_history


def test_the_config_builds_llmcad_with_an_early_exit_draft(tiny, tmp_path):
    cfg = compose_cfg(["method=llmcad", "model=tiny_random", "method.checkpoint=null",
                       "method.draft.early_exit_layers=1"], tmp_path)
    assert cfg.tree.budget == 16 and cfg.tree.branch_threshold == 0.3 and cfg.tree.alpha == 0.01
    drafter = build_drafter(cfg.method.drafter, tiny, instantiate(cfg.tree))
    assert isinstance(drafter, LLMCadDrafter) and drafter.draft.name.endswith("[:1]")
    prompt = [3, 17, 42, 8, 8, 30, 1]
    want = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 24).generate(prompt)
    got = Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), 24).generate(prompt)
    assert got.tokens == want.tokens and sum(s.accepted for s in got.steps) > 0


def test_the_experiment_compares_the_tree_with_a_chain_of_the_same_draft(tmp_path):
    cfg = compose_cfg(["experiment=seeds/llmcad_tree_vs_chain"], tmp_path)
    assert [m.label for m in cfg.methods] == ["llmcad-tree", "chain"]
    assert "method.checkpoint=artifacts/draft_smollm2_135m.safetensors" in cfg.methods[1].overrides
    assert cfg.eval.num_prompts == 20 and cfg.eval.first_turn_only and cfg.dataset.name == "mt_bench"
    assert compose_cfg(["method=llmcad"], tmp_path).method.checkpoint == "artifacts/draft_smollm2_135m.safetensors"


# Bad input: one clear line naming the value and what is valid


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_a_draft_with_another_tokenizer_is_refused(target):
    other = copy.copy(target)
    other.tokenizer = copy.deepcopy(target.tokenizer)
    other.tokenizer.add_tokens(["<extra>"])
    other.name = "other_family"
    with pytest.raises(SpecbenchError) as exc:
        LLMCadDrafter(target, LLMCadPolicy(), draft_model=other)
    assert "draft model 'other_family' has a different tokenizer from target" in one_line(exc)


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.3])
def test_a_threshold_outside_0_1_is_refused(value, tmp_path):
    cfg = compose_cfg(["method=llmcad", f"tree.branch_threshold={value}"], tmp_path)
    with pytest.raises(SpecbenchError) as exc:
        build(cfg.tree)
    assert f"tree.branch_threshold={value} is invalid: it must lie strictly between 0 and 1" in one_line(exc)


def test_a_budget_of_0_is_refused(tmp_path):
    cfg = compose_cfg(["method=llmcad", "tree.budget=0"], tmp_path)
    with pytest.raises(SpecbenchError) as exc:
        build(cfg.tree)
    assert "tree.budget=0 is invalid" in one_line(exc) and ">= 2" in one_line(exc)


@pytest.mark.parametrize("knob, value, message", [
    ("max_children", 0, "tree.max_children=0 is invalid"), ("alpha", 0, "tree.alpha=0 is invalid"),
    ("alpha_decay", 1, "tree.alpha_decay=1 is invalid"), ("alpha_rule", "min", "tree.alpha_rule='min' is unknown"),
])
def test_other_knobs_are_checked(knob, value, message):
    with pytest.raises(SpecbenchError, match=message):
        LLMCadPolicy(**{knob: value})


def test_two_drafts_are_refused(tiny):
    with pytest.raises(SpecbenchError, match="method=llmcad got two drafts"):
        LLMCadDrafter(tiny, LLMCadPolicy(), checkpoint="artifacts/draft_smollm2_135m.safetensors",
                      early_exit_layers=1)


# The memory-budget projection (specbench/hardware/modelled/llmcad.py, added to the summary by task=eval)


def test_projection_of_a_summary_row_under_a_memory_budget(tmp_path):
    project = llmcad.project_llmcad
    jetson = build(compose_cfg(["hw=jetson", "hw.memory_gb=4"], tmp_path).hw)
    target, draft = named_shape("llama2_7b"), named_shape("tinyllama_1.1b")
    got = project({"tau": 2.5, "mean_tree_size": 5.0}, jetson, target, draft)
    want = llmcad.streaming_latency(target, draft, jetson, 2.5, 4.0)["per_token_ms"].tolist()
    assert got["projected_ar_streaming_ms_per_token"] == pytest.approx(want[1])
    assert got["projected_streaming_ms_per_token"] == pytest.approx(want[2])
    assert got["projected_overlap_ms_per_token"] == pytest.approx(want[3]) and want[3] <= want[2] < want[1]
    assert got["projected_target_calls_per_token"] == pytest.approx(0.4) and got["projected_memory_gb"] == 4
    plain = project({"tau": 1.0, "mean_tree_size": 1.0}, jetson, target, draft)  # the plain row
    assert plain["projected_overlap_ms_per_token"] == plain["projected_ar_streaming_ms_per_token"]
    assert plain["projected_overlap_speedup"] == 1.0
    small = named_shape("smollm2_135m")  # fits in the budget: nothing streams, nothing to report
    assert project({"tau": 2.5, "mean_tree_size": 5.0}, jetson, small, small) == {}
