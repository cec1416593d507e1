"""task=replay: a token-only drafter replayed on a run's plain-decoding answers takes the steps the run took."""

import json

import pandas as pd
import pytest

from specbench.errors import SpecbenchError
from specbench.evaluation.replay import replay
from specbench.tasks import dispatch

from .conftest import compose_cfg

# the warm-up generation and the memory probe on (the defaults): they decode the first prompt untimed, which suffix
# decoding's global tree must not learn from; and both turns, each prompt encoded after the method's own answer
RUN = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=3", "eval.max_new_tokens=40",
       "eval.first_turn_only=false", "eval.fastest_plain=false", "eval.latency_profile=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """An evaluation of PLD and suffix decoding (whose global tree learns across answers) beside plain decoding."""
    from specbench.tasks import eval as eval_task

    folder = tmp_path_factory.mktemp("run")
    summary = eval_task.run(compose_cfg(RUN + ["methods=[pld,suffix]"], folder))  # each at its own budget
    return folder, summary


def replayed(run_folder, tmp_path, *overrides):
    return dispatch(compose_cfg(["task=replay", "model=tiny_random", f"replay.run={run_folder}", *overrides],
                                tmp_path / "replay"))


@pytest.mark.parametrize("method", ["pld", "suffix"])
def test_a_replay_takes_the_steps_the_run_took(run, tmp_path, method):
    folder, summary = run
    out = replayed(folder, tmp_path, f"method={method}")
    recorded = summary.set_index("method").loc[method, "tau"]
    assert recorded > 1.0  # the tiny model repeats itself, so there is something to accept
    assert out["tau"].item() == pytest.approx(recorded, rel=1e-12)
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    steps = [r["steps"] for r in records if r["method"] == method]
    assert pd.read_csv(tmp_path / "replay" / "replay.csv")["steps"].tolist() == steps
    smaller = replayed(folder, tmp_path, f"method={method}", "tree.budget=2")  # one drafted token a step
    assert smaller["tau"].item() < out["tau"].item()


@pytest.mark.slow
def test_a_resumed_run_drafts_as_the_unbroken_one_and_its_replay_takes_its_steps(tmp_path):
    """Killed after 2 prompts and resumed for 4, suffix decoding first learns the folder's answers (its global tree
    would otherwise start empty), so every answer takes the steps of a run never stopped, and of the replay."""
    from specbench.tasks import eval as eval_task

    def steps(folder):
        return [r["steps"] for r in map(json.loads, (folder / "records.jsonl").read_text().splitlines())
                if r["method"] == "suffix"]

    run = [*RUN, "eval.first_turn_only=true", "eval.max_new_tokens=24", "eval.memory_probe=false", "method=suffix"]
    eval_task.run(compose_cfg([*run, "eval.num_prompts=2"], tmp_path / "resumed"))
    eval_task.run(compose_cfg([*run, "eval.num_prompts=4"], tmp_path / "resumed"))
    eval_task.run(compose_cfg([*run, "eval.num_prompts=4"], tmp_path / "unbroken"))
    assert len(steps(tmp_path / "unbroken")) == 4 and steps(tmp_path / "resumed") == steps(tmp_path / "unbroken")
    replayed(tmp_path / "resumed", tmp_path, "method=suffix")
    assert pd.read_csv(tmp_path / "replay" / "replay.csv")["steps"].tolist() == steps(tmp_path / "unbroken")


def test_replay_follows_acceptance_by_hand():
    """A chain drafter that always guesses 7, 7: the answer 7 7 7 5 7 after its first token is taken in steps of
    3 (two accepted, then the target's 7), then 1 (5 rejected at once), then the 7 that ends it."""
    from specbench.drafters.base import Drafter
    from specbench.trees.token_tree import TokenTree

    class Sevens(Drafter):
        def propose(self, state):
            return TokenTree.chain(state.root, [7, 7])

    out = replay(Sevens(), prompt=[1, 2], answer=[9, 7, 7, 7, 5, 7])
    assert out.accept_lengths == [3, 1, 1]


def test_what_cannot_be_replayed_is_one_line(run, tmp_path):
    folder, _ = run
    with pytest.raises(SpecbenchError, match="method=eagle drafts from the target's outputs"):
        replayed(folder, tmp_path, "method=eagle")
    with pytest.raises(SpecbenchError, match=r"replay.reference=nobody has no answers .*; its methods: "
                                             r"plain, pld, suffix"):
        replayed(folder, tmp_path, "method=pld", "replay.reference=nobody")
    with pytest.raises(SpecbenchError, match="task=replay needs replay.run="):
        dispatch(compose_cfg(["task=replay", "model=tiny_random", "method=pld"], tmp_path / "replay"))
    with pytest.raises(SpecbenchError, match="have dataset mt_bench, not humaneval: give dataset= the run's"):
        replayed(folder, tmp_path, "method=pld", "dataset=humaneval")
    with pytest.raises(SpecbenchError, match="a replay follows greedy exact acceptance"):
        replayed(folder, tmp_path, "method=pld", "sampling.temperature=0.7")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    lines = (folder / "records.jsonl").read_text().splitlines(keepends=True)
    (damaged / "records.jsonl").write_text("".join([lines[0], "{not json\n", *lines[1:]]))
    with pytest.raises(SpecbenchError, match=r"records.jsonl line 2 is not JSON"):
        replayed(damaged, tmp_path, "method=pld")
    assert (damaged / "records.jsonl").read_text().count("{not json") == 1  # a replay changes no file
