"""The machine's row check: a verify route's rows are measured against plain decoding's one-row forwards, recorded in
the machine profile once per execution, and a route whose rows differ beyond float rounding is never chosen by auto
and is named in the run's table. What a CPU's kernels give is measured, never asserted: the tests build routes whose
rows differ by construction."""

import pandas as pd
import pytest
import torch

from specbench.hardware.measured import machine_profile
from specbench.hardware.measured.machine_profile import MachineProfile, load_or_measure_profile, mark_stale
from specbench.hardware.measured.row_invariance import (
    BITWISE,
    CHAINS,
    DIFFERS,
    ROUNDING,
    TREE_PARENTS,
    RowInvariance,
    check_rows,
    verdict,
)

from .test_machine_profile import CONTEXTS, PEAKS, SIZES, fake_latency


class RowDependent(torch.nn.Module):
    """The tiny model with `shift` x (rows in the call - 1) added to every logit: a route whose rows move with their
    call, as int8 activations of a multi-row call do on a CPU that quantises them."""

    def __init__(self, model, shift: float) -> None:
        super().__init__()
        self.model, self.shift, self.config = model, shift, model.config

    @property
    def device(self):
        return self.model.device

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def forward(self, input_ids=None, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        out.logits = out.logits + self.shift * (input_ids.shape[1] - 1)
        return out


def test_the_verdict_tells_bitwise_rows_from_float_rounding_from_a_real_difference():
    assert verdict(0.0, 30.0, torch.float32) == BITWISE
    assert verdict(6e-5, 30.0, torch.float32) == ROUNDING  # sums in another order
    assert verdict(0.8, 30.0, torch.float32) == DIFFERS  # an int8 rounding moved a logit
    assert verdict(0.5, 30.0, torch.bfloat16) == ROUNDING  # two bf16 units in the last place at 30
    assert RowInvariance(DIFFERS, 0.8, 30.0, 10, (30,)).lossless is False
    assert RowInvariance(ROUNDING, 6e-5, 30.0, 10, (30,)).lossless is True
    data = RowInvariance(ROUNDING, 6e-5, 30.0, 10, (30, 250)).as_dict()
    assert RowInvariance.from_dict(data) == RowInvariance(ROUNDING, 6e-5, 30.0, 10, (30, 250))


@pytest.mark.parametrize("shift, expected", [(0.1, DIFFERS), (1e-6, ROUNDING)])
def test_the_check_finds_rows_that_move_with_their_call(tiny, shift, expected):
    """Every row of the chains and the tree is compared: a shift that grows with the call's rows is found, and its
    size decides the verdict."""
    got = check_rows(RowDependent(tiny.model, shift), torch.float32, tiny.model.config.vocab_size, contexts=(5, 12),
                     chains=(2, 4), tree_parents=(-1, 0, 0, 1))
    assert got.verdict == expected
    assert got.rows == 2 * (2 + 4 + 4)
    assert got.max_abs_diff == pytest.approx(shift * 3, abs=1e-4)  # the 4-row calls' rows, plus float rounding


def test_the_tiny_model_in_float32_keeps_its_rows_within_rounding_on_this_machine(tiny):
    """Whether rows are bitwise depends on this CPU's kernels; that they stay within float32 rounding does not."""
    got = check_rows(tiny.model, torch.float32, tiny.model.config.vocab_size, contexts=(5, 40))
    assert got.verdict in (BITWISE, ROUNDING) and got.lossless
    assert got.rows == 2 * (sum(CHAINS) + len(TREE_PARENTS))  # every chain's rows and the tree's, at both contexts


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    timed, checked = [], []
    monkeypatch.setattr(machine_profile, "measure_peaks", lambda device: PEAKS)
    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: timed.append(a) or fake_latency(*a, **k))
    monkeypatch.setattr(machine_profile, "busy", lambda machine: False)
    real = machine_profile.check_rows
    monkeypatch.setattr(machine_profile, "check_rows",
                        lambda *a, **k: checked.append(a) or real(*a, contexts=(4,), chains=(2,), tree_parents=(-1, 0)))
    return timed, checked


def test_the_profile_keeps_each_executions_row_check_and_checks_an_old_profile_without_timing_it(tiny, measuring):
    timed, checked = measuring
    first = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    assert (len(timed), len(checked)) == (1, 1)
    assert first.rows["eager/float32"].lossless and first.rows["eager/float32"].rows == 2 * 2
    again = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    assert (len(timed), len(checked)) == (1, 1) and again.rows == first.rows  # read from the cache
    old = MachineProfile(first.machine, "cpu", tiny.name, PEAKS, first.latency)  # cached before rows were checked
    first.path.write_text(old.to_json())
    checked_now = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    assert (len(timed), len(checked)) == (1, 2)  # checked, not timed again
    assert "eager/float32" in checked_now.rows


def test_an_execution_a_run_marks_stale_is_timed_and_checked_again_by_the_next_run(tiny, measuring):
    timed, checked = measuring
    profile = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    mark_stale(profile, ["eager/float32"])
    assert MachineProfile.from_json(profile.path.read_text()).stale == ["eager/float32"]
    again = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    assert (len(timed), len(checked)) == (2, 2) and again.stale == []
    assert MachineProfile.from_json(profile.path.read_text()).stale == []


def test_a_profile_with_damaged_row_checks_is_measured_again_with_a_notice(tiny, measuring, capsys):
    profile = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    data = profile.to_json().replace('"verdict"', '"verdikt"')
    profile.path.write_text(data)
    load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, backends=["eager"])
    assert "holds rows=" in capsys.readouterr().out


def test_a_run_on_a_route_whose_rows_differ_says_so_and_still_measures_losslessness(tmp_path, monkeypatch, capsys):
    """The user names the route (auto would not take it): the run decodes, its table says losslessness is not
    promised on this CPU, and the lossless column still counts the answers that match."""
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    from .test_evaluator import FAST, hand_made_profile

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    profile = hand_made_profile(fast_small="float32", fast_large="float32")
    profile.latency = profile.latency[profile.latency["dtype"] == "float32"]
    profile.rows = {"eager/float32": RowInvariance(DIFFERS, 0.84, 20.0, 76, (30, 250))}
    path = machine_profile.profile_path("tiny_random", "cpu")
    path.parent.mkdir(parents=True)
    path.write_text(profile.to_json())
    overrides = [*FAST, "eval.dtype=float32", "model.backend=eager", "eval.num_prompts=2", "eval.first_turn_only=true",
                 "eval.profile_backends=[eager]", "eval.profile_weights=[fp]", "eval.fastest_plain=true"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    out = capsys.readouterr().out
    assert "eager/float32: rows differ from their one-row forwards by up to 0.84 logits" in out
    assert "losslessness is not promised on this CPU for pld (the lossless column measures it)" in out
    assert summary.loc["pld", "row_check"] == DIFFERS and pd.notna(summary.loc["pld", "lossless_match"])
    assert "= plain, not promised here" in out


def test_a_run_that_measures_another_plain_decoding_fastest_says_so_and_marks_both_stale(tiny, measuring):
    """The profile ranked eager/bfloat16 the fastest plain decoding of an answer; the run measured eager/float32 faster
    by more than the margin: one line names both with the run's numbers, and the next run measures both again. Within
    the margin nothing is said."""
    from types import SimpleNamespace

    from specbench.evaluation.precision import ExecutionPlan
    from specbench.evaluation.summary import _plan_disagreements
    from specbench.execution.value import Execution

    profile = load_or_measure_profile(tiny, dtypes=["float32", "bfloat16"], sizes=SIZES, contexts=CONTEXTS,
                                      backends=["eager"])
    plan = SimpleNamespace(machine=profile, context=16, execution=ExecutionPlan(
        "eager", "float32", "", Execution("eager", "bfloat16"), "fp"))
    summary = pd.DataFrame({"method": ["plain", "plain@bfloat16", "pld"],
                            "backend": ["eager"] * 3, "dtype": ["float32", "bfloat16", "float32"],
                            "weights": ["fp"] * 3, "tokens_per_s": [18.9, 15.5, 17.0],
                            "row_check": [ROUNDING, ROUNDING, ROUNDING], "row_check_note": ["", "", ""]})
    lines = _plan_disagreements(summary, plan)
    assert lines == ["the machine profile ranked eager/bfloat16 the fastest plain decoding of an answer; this run "
                     "measured eager/float32 faster (18.9 against 15.5 tok/s, prefill included): both are measured "
                     "again on the next run"]
    assert MachineProfile.from_json(profile.path.read_text()).stale == ["eager/bfloat16", "eager/float32"]
    close = summary.assign(tokens_per_s=[16.0, 15.5, 17.0])
    assert _plan_disagreements(close, plan) == []


@pytest.mark.parametrize("past", [0, 3, 40, 250])
def test_the_row_invariant_attentions_key_layout_depends_on_the_rows_position_alone(past):
    """The logic w4a8r's row invariance rests on, machine-independent: for every row of a tree verify, the keys
    recent_attention reads, slot by slot (which position each window slot holds and whether the row sees it, and which
    cached slots it reads where they lie), are the ones plain decoding reads for that row, when its ancestors are
    cached rows instead of new rows of the call. Whether a CPU's kernels then add them in the same order in calls of
    other row counts is the machine profile's row check."""
    from specbench.execution.openvino import window_inputs
    from specbench.trees.token_tree import TokenTree

    tree = TokenTree(torch.arange(9), torch.tensor([-1, 0, 0, 1, 3, 4, 5, 6, 2]))  # a chain 7 deep and a branch
    padded = past + 64
    mask = torch.cat([torch.ones(len(tree), past, dtype=torch.bool), tree.ancestor_mask()], 1)[None, None]
    positions = past + tree.depths[None]

    def layout(window, positions, past):
        cached_mask, slot, row, is_new, seen = window
        held = torch.where(is_new, positions[0][row], slot)  # the position each window slot holds
        return [(cached_mask[0, 0, r, :past].nonzero().flatten().tolist(),
                 [(int(p), bool(s)) for p, s in zip(held[r], seen[r]) if s]) for r in range(len(slot))]

    verify = layout(window_inputs(mask, positions, past, padded), positions, past)
    for node in range(len(tree)):
        depth = int(tree.depths[node])
        alone_mask = torch.ones(1, 1, 1, past + depth + 1, dtype=torch.bool)
        position = torch.tensor([[past + depth]])
        alone = layout(window_inputs(alone_mask, position, past + depth, padded), position, past + depth)[0]
        cached_slots, window = verify[node]
        assert alone[0] == cached_slots, node  # the cached keys below the window, where they lie
        assert alone[1] == window, node  # the window: the same positions in the same slots, the same seen
        assert [p for p, _ in window] == list(range(window[0][0], past + depth + 1)), node  # the path, in order
