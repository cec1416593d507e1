"""The run-folder contract, the summary columns and resume-after-kill, on the tiny model."""

import json

import pandas as pd
import pytest

from specbench.decoding import Decoder
from specbench.drafters.base import DrafterCost
from specbench.errors import SpecbenchError
from specbench.evaluation.metrics import paired_speedup, per_depth_acceptance, summarize
from specbench.evaluation.precision import ExecutionPlan, plan
from specbench.hardware.measured.machine import machine_info
from specbench.hardware.measured.machine_profile import MachineProfile, profile_path
from specbench.models.shape import named_shape
from specbench.tasks import eval as eval_task
from specbench.trees.hardware_aware import best_budget

from .conftest import compose_cfg, random_medusa_artifact

FAST = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=4", "eval.max_new_tokens=24",
        "eval.profile_sizes=[1,2,4]", "eval.profile_repeats=1", "eval.warmup=0", "eval.memory_probe=false",
        "eval.fastest_plain=false"]


def test_eval_writes_the_run_folder_contract(tmp_path):
    cfg = compose_cfg([*FAST, "eval.first_turn_only=false"], tmp_path)
    summary = eval_task.run(cfg)
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    # MT-Bench has two turns: both are decoded, the second after each method's own first answer
    assert {(r["method"]) for r in records} == {"plain", "pld"} and len(records) == 16
    assert {r["turn"] for r in records} == {0, 1}
    for key in ("method", "question_id", "category", "new_tokens", "steps", "wall_time", "prefill_time",
                "draft_time", "verify_time", "accept_lengths", "output_ids"):
        assert key in records[0]
    table = pd.read_csv(tmp_path / "summary.csv")
    for col in ("method", "tau", "tokens_per_s", "decode_tokens_per_s", "speedup", "overhead", "lossless_match",
                "method_mem_mb", "kv_peak_mb", "speedup_mean_of_ratios", "speedup_geomean", "speedup_ci_low", "speedup_ci_high",
                "speedup_vs_own_plain", "fastest_plain", "skipped_prompts", "cut_by_context", "num_prompts"):
        assert col in table.columns
    row = summary.set_index("method").loc["pld"]
    assert row["lossless_match"] == 1.0  # fp32, greedy, exact acceptance
    assert summary.set_index("method").loc["plain", "tau"] == 1.0
    assert row["tau"] >= 1.0
    assert json.loads((tmp_path / "summary.json").read_text())[1]["per_depth_acceptance"] is not None
    assert {p.name for p in (tmp_path / "plots").glob("*.png")} >= {"speed.png", "accept_lengths.png"}


def test_every_context_a_run_reaches_is_compiled_ahead_before_its_first_timed_generation(tmp_path, monkeypatch):
    """A target that compiles per context size (openvino's static models) is told the contexts the run will reach
    once, after the warm-up and before any timed prompt: from the shortest first question to the longest
    conversation with a full answer to every turn."""
    cfg = compose_cfg([*FAST, "eval.first_turn_only=false", "eval.warmup=1"], tmp_path)
    calls, real = [], Decoder.generate

    def generate(self, prompt_ids):
        calls.append(("generate", len(prompt_ids)))
        return real(self, prompt_ids)

    monkeypatch.setattr(Decoder, "generate", generate)
    monkeypatch.setattr(Decoder, "compile_ahead", lambda self, shortest, longest: calls.append((shortest, longest)))
    eval_task.run(cfg)
    ahead = [i for i, call in enumerate(calls) if call[0] != "generate"]
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    methods = len({r["method"] for r in records})
    assert len(ahead) == methods and ahead[0] == methods  # after one warm-up generation per method, before the rest
    (shortest, longest), = set(calls[i] for i in ahead)
    assert shortest == min(r["prompt_len"] for r in records if r["turn"] == 0)
    assert all(shortest <= r["prompt_len"] and r["prompt_len"] + r["new_tokens"] <= longest for r in records)


def test_a_killed_run_resumes_without_duplicates_or_losses(tmp_path, monkeypatch):
    cfg = compose_cfg([*FAST, "eval.first_turn_only=true"], tmp_path)
    real = Decoder.generate
    calls = {"n": 0}

    def dies_on_the_fifth_generation(self, prompt_ids):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt("killed")
        return real(self, prompt_ids)

    monkeypatch.setattr(Decoder, "generate", dies_on_the_fifth_generation)
    with pytest.raises(KeyboardInterrupt):
        eval_task.run(cfg)
    partial = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(partial) == 4  # two prompts x two methods were flushed before the kill
    with (tmp_path / "records.jsonl").open("a") as fh:
        fh.write('{"method": "pld", "question_id": "cut mid-wri')  # a line cut by the kill
    monkeypatch.setattr(Decoder, "generate", real)
    eval_task.run(cfg)
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    keys = [(r["method"], r["question_id"]) for r in records]
    assert len(keys) == len(set(keys)) == 8
    assert records[:4] == partial  # nothing already written was lost or rewritten


def test_a_run_without_plain_decoding_ends_with_its_summary_and_plots(tmp_path):
    """eval.plain=false decodes the methods alone: no speedup exists, and the run still writes its summary and every
    plot (the speed plot's axis once failed on speedups that are all NaN, after every prompt had decoded)."""
    summary = eval_task.run(compose_cfg([*FAST, "eval.num_prompts=2", "eval.plain=false"], tmp_path))
    assert list(summary["method"]) == ["pld"] and summary["speedup"].isna().all()
    assert (tmp_path / "summary.csv").exists() and (tmp_path / "plots" / "speed.png").stat().st_size > 0


def test_sampling_runs_report_a_distribution_check_instead_of_token_equality(tmp_path):
    summary = eval_task.run(compose_cfg([*FAST, "sampling=sample", "eval.latency_profile=false"], tmp_path))
    row = summary.set_index("method").loc["pld"]
    assert pd.isna(row["lossless_match"])  # outputs differ by design when sampling
    assert row["mean_nll"] > 0 and pd.notna(row["nll_z"])


def test_plain_decoding_samples_from_the_target_whatever_rule_the_method_uses(tmp_path):
    """Typical acceptance takes the greedy token at the root; plain decoding must still sample from the target."""
    eval_task.run(compose_cfg([*FAST, "sampling=sample", "accept=typical", "eval.latency_profile=false"], tmp_path))
    sampled = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    base = [r for r in sampled if r["method"] == "plain"]
    assert {r["accept"] for r in base} == {"exact"}


@pytest.mark.slow
def test_many_methods_run_interleaved_in_one_folder_with_their_own_budgets(tmp_path):
    overrides = [*FAST, "eval.first_turn_only=true", "eval.latency_profile=false",
                 "methods=[pld,{method:pld,label:pld-3,overrides:['tree.budget=3']}]"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path), overrides)
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["method"] for r in records[:3]] == ["plain", "pld", "pld-3"]  # per prompt, back to back
    assert [r["method"] for r in records[3:6]] == ["pld", "pld-3", "plain"]  # the first place rotates
    assert max(max(r["tree_sizes"]) for r in records if r["method"] == "pld-3") <= 3
    assert max(max(r["tree_sizes"]) for r in records if r["method"] == "pld") > 3
    table = summary.set_index("method")
    assert list(table.index) == ["plain", "pld", "pld-3"]
    assert (table["lossless_match"] == 1.0).all()
    for label in ("pld", "pld-3"):  # the paired interval holds the ratio of means it is an interval of
        assert table.loc[label, "speedup_ci_low"] <= table.loc[label, "speedup"] <= table.loc[label, "speedup_ci_high"]
    assert table.loc["pld", "settings_hash"] != table.loc["pld-3", "settings_hash"]


def test_every_record_and_summary_row_says_where_it_came_from(tmp_path):
    summary = eval_task.run(compose_cfg([*FAST, "eval.num_prompts=1", "eval.latency_profile=false",
                                         "eval.memory_probe=true"], tmp_path))
    record = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    for key in ("model", "dtype", "hw", "dataset", "cpu_model", "cpu_capability", "threads", "torch_version",
                "transformers_version", "git_commit", "settings_hash"):
        assert key in record and key in row.index, key
    assert record["model"] == "tiny_random" and record["dtype"] == "float32" and row["dataset"] == "mt_bench"
    assert summary["method_mem_mb"].notna().all()


@pytest.mark.slow
def test_a_rerun_with_the_same_settings_resumes_and_decodes_nothing(tmp_path, monkeypatch):
    cfg = compose_cfg([*FAST, "eval.latency_profile=false"], tmp_path)
    eval_task.run(cfg)
    before = (tmp_path / "records.jsonl").read_text()
    monkeypatch.setattr(Decoder, "generate", lambda *a: pytest.fail("a finished prompt was decoded again"))
    eval_task.run(cfg)
    assert (tmp_path / "records.jsonl").read_text() == before


def test_a_rerun_with_other_settings_into_the_same_folder_is_refused_naming_the_key(tmp_path):
    eval_task.run(compose_cfg([*FAST, "eval.num_prompts=1", "eval.latency_profile=false"], tmp_path))
    with pytest.raises(SpecbenchError, match=r"eval\.max_new_tokens: 24 -> 16.*new timestamped folder"):
        eval_task.run(compose_cfg([*FAST, "eval.num_prompts=1", "eval.max_new_tokens=16"], tmp_path))
    with pytest.raises(SpecbenchError, match=r"methods\[pld\]\.tree\.budget: 11 -> 5"):
        eval_task.run(compose_cfg([*FAST, "eval.num_prompts=1", "tree.budget=5"], tmp_path))
    # more prompts, or another method, with the same settings: allowed
    eval_task.run(compose_cfg([*FAST, "eval.num_prompts=2", "eval.latency_profile=false"], tmp_path))


def test_a_folder_resumed_on_another_machine_is_other_settings(tmp_path, monkeypatch):
    """Another CPU's records would pair its timings (and its kernels' near-tie argmaxes) with this one's."""
    from specbench.hardware.measured import machine

    over = [*FAST, "eval.num_prompts=1", "eval.latency_profile=false"]
    eval_task.run(compose_cfg(over, tmp_path))
    here = machine.identity()
    monkeypatch.setattr(machine, "identity", lambda info=None: here | {"cpu_capability": "OTHER"})
    with pytest.raises(SpecbenchError, match=rf"machine\.cpu_capability: '{here['cpu_capability']}' -> 'OTHER'"):
        eval_task.run(compose_cfg(over, tmp_path))


def test_a_drafter_retrained_into_the_same_path_is_other_settings(tmp_path, tiny):
    """The folder's records were decoded with the old heads: resuming with the new file at the same path would mix
    two drafters under one label, so the rerun is refused naming the checkpoint's fingerprint."""
    from safetensors.torch import load_file, save_file

    art = random_medusa_artifact(tmp_path / "art" / "m.safetensors", tiny, [[0.5, 0.2]] * 3)
    run = tmp_path / "run"
    over = [*FAST, "method=medusa", f"method.checkpoint={art}", "tree.budget=8", "eval.num_prompts=1",
            "eval.latency_profile=false"]
    eval_task.run(compose_cfg(over, run))
    eval_task.run(compose_cfg(over, run))  # the same file: resumed
    tensors = load_file(str(art))
    save_file({k: v + 0.01 for k, v in tensors.items()}, str(art))  # retrained: same path and .json, other weights
    with pytest.raises(SpecbenchError, match=r"methods\[medusa\]\.method\.checkpoint_fingerprint: '\w+' -> '\w+'"):
        eval_task.run(compose_cfg(over, run))


def test_a_tree_the_method_would_ignore_is_an_error(tmp_path):
    with pytest.raises(SpecbenchError, match="tree=dynamic does not apply.*tree=native"):
        eval_task.run(compose_cfg([*FAST, "method=pld", "tree=dynamic"], tmp_path))


def test_paired_speedup_and_its_interval_from_hand_made_records():
    def rows(method, times):
        return [{"method": method, "question_id": str(i), "turn": 0, "new_tokens": 10, "wall_time": t}
                for i, t in enumerate(times)]

    base = pd.DataFrame(rows("plain", [1.0, 2.0, 1.0, 4.0]))
    grp = pd.DataFrame(rows("m", [0.5, 2.0, 0.5, 2.0]))  # per-prompt speedups 2, 1, 2, 2
    out = paired_speedup(grp, base)
    assert out["speedup"] == pytest.approx((40 / 5.0) / (40 / 8.0)) == pytest.approx(1.6)  # total tokens / total time
    assert out["speedup_mean_of_ratios"] == pytest.approx(1.75) and out["paired_prompts"] == 4
    assert out["speedup_geomean"] == pytest.approx(8 ** 0.25)
    assert 1.0 <= out["speedup_ci_low"] <= 1.6 <= out["speedup_ci_high"] <= 2.0


def test_the_headline_is_the_ratio_of_means_even_where_the_mean_of_ratios_reverses_the_verdict():
    """A method twice as fast on short prompts but slower on the long ones, where most of the time goes: the mean
    of per-prompt ratios says it wins, the total time says it loses, and the headline follows the total time."""
    def rows(method, tokens, times):
        return [{"method": method, "question_id": str(i), "turn": 0, "new_tokens": n, "wall_time": t}
                for i, (n, t) in enumerate(zip(tokens, times))]

    tokens = [8, 8, 8, 256]
    base = pd.DataFrame(rows("plain", tokens, [1.0, 1.0, 1.0, 32.0]))
    grp = pd.DataFrame(rows("m", tokens, [0.5, 0.5, 0.5, 48.0]))
    out = paired_speedup(grp, base)
    assert out["speedup_mean_of_ratios"] > 1.0 > out["speedup"] == pytest.approx(35.0 / 49.5)
    assert out["speedup_ci_low"] <= out["speedup"] <= out["speedup_ci_high"]
    # pairs are kept: a prompt only one side decoded does not enter the ratio
    assert paired_speedup(grp.iloc[:3], base)["speedup"] == pytest.approx(2.0)


def hand_made_profile(fast_small: str, fast_large: str):
    """A machine profile where `fast_small` has the cheapest one-token forward and `fast_large` the cheapest wide one
    (as bf16 and fp32 trade places on an AVX2 CPU without native bf16)."""
    rows = []
    for dtype in ("float32", "bfloat16"):
        for context in (128, 256, 1024):
            for n in (1, 2, 4, 8, 16, 32, 64):
                ms = 30 + 15 * (n - 1) if dtype == fast_small else 50 + 1.0 * n  # slope vs flat
                rows.append({"dtype": dtype, "context": context, "tokens": n, "ms": float(ms)})
    peaks = {"peak_tflops": {"float32": 0.1, "bfloat16": 0.1}, "mem_bandwidth_gbs": 10.0, "layer_overhead_ms": 0.1,
             "memory_gb": 8.0}
    return MachineProfile(machine_info(), "cpu", "tiny_random", peaks, pd.DataFrame(rows))


def test_auto_dtype_picks_the_cheapest_verify_and_names_the_fastest_plain_decoding():
    profile = hand_made_profile(fast_small="bfloat16", fast_large="float32")
    wide = plan("auto", "eager", profile, tree_size=16, context=256)
    assert wide.dtype == "float32" and wide.fastest_plain == ("eager", "bfloat16", "fp")  # 65 vs 255 ms at n=16; 30 vs 51 at n=1
    assert "float32" in wide.reason and "bfloat16" in wide.reason and wide.label_of(wide.fastest_plain) == "bfloat16"
    assert plan("auto", "auto", profile, tree_size=1, context=256).dtype == "bfloat16"
    assert plan("float32", "eager", profile, 16, 256) == ExecutionPlan(
        "eager", "float32", "eager/float32: set by model.backend, eval.dtype and model.weights",
        ("eager", "bfloat16", "fp"), "fp", ("eager", "bfloat16", "fp"))
    with pytest.raises(SpecbenchError, match="eval.dtype='fp8' is unknown; valid choices: auto"):
        plan("fp8", "eager", profile, 16, 256)
    with pytest.raises(SpecbenchError, match="model.backend='tvm' is unknown; valid choices: auto, eager, prepacked"):
        plan("auto", "tvm", profile, 16, 256)


def test_the_fastest_plain_decoding_is_ranked_by_a_whole_answer_prefill_included():
    """bf16 has the cheaper one-token step here (30 against 51 ms) but its forward grows 15 ms a row: a 128-token
    prompt and 32 new tokens cost it 1935 + 32 x 30 ms against float32's 178 + 32 x 51, so float32 is the fastest plain
    decoding of that answer, as the headline's tokens/s (prefill included) will measure; a long answer of one-token
    steps is bf16's again."""
    profile = hand_made_profile(fast_small="bfloat16", fast_large="float32")
    assert plan("float32", "eager", profile, 16, 256).fastest_plain == ("eager", "bfloat16", "fp")  # one token alone
    assert plan("float32", "eager", profile, 16, 256, answer=(128, 32)).fastest_plain == ("eager", "float32", "fp")
    assert plan("float32", "eager", profile, 16, 256, answer=(128, 512)).fastest_plain == ("eager", "bfloat16", "fp")


def test_a_run_also_decodes_plain_ar_in_the_dtype_fastest_for_it_and_reports_speed_against_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    path = profile_path("tiny_random", "cpu")
    path.parent.mkdir(parents=True)
    path.write_text(hand_made_profile(fast_small="bfloat16", fast_large="float32").to_json())
    overrides = [*FAST, "eval.dtype=auto", "eval.fastest_plain=true", "eval.num_prompts=2", "eval.first_turn_only=true",
                 "eval.profile_backends=[eager]", "eval.profile_weights=[fp]",
                 "eval.profile_context=8"]  # short prompts: bf16's cheaper one-token step wins the answer
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert list(summary.index) == ["plain", "plain@bfloat16", "pld"]
    assert summary.loc["plain", "dtype"] == "float32" and summary.loc["plain@bfloat16", "dtype"] == "bfloat16"
    fastest = summary["tokens_per_s"][["plain", "plain@bfloat16"]].idxmax()
    assert (summary["fastest_plain"] == fastest).all()
    assert summary.loc["pld", "speedup"] == pytest.approx(
        summary.loc["pld", "tokens_per_s"] / summary.loc[fastest, "tokens_per_s"])
    assert summary.loc["pld", "speedup_vs_own_plain"] == pytest.approx(
        summary.loc["pld", "tokens_per_s"] / summary.loc["plain", "tokens_per_s"])


def test_hardware_aware_tree_is_sized_from_the_machine_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    profile = hand_made_profile(fast_small="bfloat16", fast_large="float32")
    profile_path("tiny_random", "cpu").parent.mkdir(parents=True)
    profile_path("tiny_random", "cpu").write_text(profile.to_json())
    acc = [[0.6, 0.2], [0.5, 0.2]]
    overrides = [*FAST, "method=draft_model", "method.checkpoint=null", "method.draft.early_exit_layers=1", "tree=hardware_aware",
                 f"tree.accept_prob={acc}", "tree.budget=16", "eval.num_prompts=1", "eval.first_turn_only=true",
                 "eval.profile_weights=[fp]"]
    eval_task.run(compose_cfg(overrides, tmp_path / "run"))
    expected, _ = best_budget(acc, lambda n: profile.latency_ms("float32", n, 128 + 24 / 2, "eager"), 16)
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert max(max(r["tree_sizes"]) for r in records if r["method"] == "draft_model") == expected
    # below the table's 7 nodes: the 7th node's tau gain no longer pays for its row, and 5 nodes' rate is within 5%
    # of 6's, the best: a near-tie, which the smaller tree takes
    assert expected == 5


def test_the_headline_is_against_the_same_weights_and_the_fastest_of_any_weights_stands_beside_it():
    """Plain fp32 decoding at 10 tok/s, plain int4 at 20 (another model's answers), a method on fp weights at 15:
    the headline is 1.5x against the fp plain decoding, and 0.75x against the int4 one beside it. An int4 method is
    judged against int4 plain decoding."""
    def rows(method, weights, seconds, name=None):
        return [{"method": method, "method_name": name or method.split("@")[0], "weights": weights,
                 "question_id": str(i), "turn": 0, "prompt_len": 10, "new_tokens": 10, "steps": 9,
                 "accept_lengths": [1] * 9, "tree_depths": [1] * 9, "tree_sizes": [1] * 9, "wall_time": t,
                 "prefill_time": 0.0, "draft_time": 0.0, "verify_time": t, "framework_times": [0.0],
                 "output_ids": [1], "kv_peak_bytes": 0, "drafter_params": 0, "drafter_bytes": 0, "lossless_rule": True,
                 "temperature": 0.0, "token_logprobs": []} for i, t in enumerate(seconds)]

    records = pd.DataFrame(rows("plain", "fp", [1.0, 1.0]) + rows("plain@int4_g32", "int4_g32",
                           [0.5, 0.5]) + rows("pld", "fp", [2 / 3, 2 / 3]) + rows("pld-int4", "int4_g32", [0.4, 0.4],
                                                                                  "pld"))
    summary = summarize(records).set_index("method")
    assert summary.loc["pld", "fastest_plain"] == "plain"
    assert summary.loc["pld", "speedup"] == pytest.approx(1.5)
    assert summary.loc["pld", "fastest_plain_any"] == "plain@int4_g32"
    assert summary.loc["pld", "speedup_any"] == pytest.approx(0.75)
    assert summary.loc["pld-int4", "fastest_plain"] == "plain@int4_g32"
    assert summary.loc["pld-int4", "speedup"] == pytest.approx(1.25) == summary.loc["pld-int4", "speedup_any"]
    # a plain fp decoding on a faster backend becomes the fp methods' reference, the int4 ones keep theirs
    faster = pd.concat([records, pd.DataFrame(rows("plain@prepacked", "fp", [0.8, 0.8]))])
    summary = summarize(faster).set_index("method")
    assert summary.loc["pld", "fastest_plain"] == "plain@prepacked"
    assert summary.loc["pld", "speedup"] == pytest.approx(1.2)
    assert summary.loc["pld-int4", "fastest_plain"] == "plain@int4_g32"


def test_a_run_adds_the_fastest_plain_decoding_of_its_own_weights_beside_the_fastest_of_any():
    """A profile where int4 is the fastest plain decoding and prepacked fp32 the fastest of the float weights, on an
    eager fp32 run: both plain decodings run beside the run's own."""
    frame = hand_made_profile(fast_small="float32", fast_large="float32").latency
    rows = [frame.assign(backend="eager", weights="fp"), frame.assign(backend="prepacked", weights="fp", ms=frame["ms"] * 0.8),
            frame.assign(backend="eager", weights="int4_g32", ms=frame["ms"] * 0.5)]
    profile = MachineProfile(machine_info(), "cpu", "tiny_random", hand_made_profile("float32", "float32").peaks,
                             pd.concat(rows, ignore_index=True))
    execution = plan("float32", "eager", profile, 8, 256, "fp", ["fp", "int4_g32"])
    assert execution.fastest_plain[2] == "int4_g32" and execution.same_weights_plain[:1] == ("prepacked",)
    from specbench.evaluation.plan import fastest_plain_runs
    cfg = compose_cfg([*FAST, "eval.fastest_plain=true"], None)
    labels = fastest_plain_runs(cfg, execution)
    assert labels == {"plain@prepacked": execution.same_weights_plain,
                      "plain@" + "/".join(x for x, own in zip(execution.fastest_plain, execution.own) if x != own):
                          execution.fastest_plain}


def test_auto_never_verifies_on_a_route_whose_rows_the_machine_found_to_differ():
    """Where the machine profile's row check found a route's verify rows beyond float rounding of its one-row forwards
    (int8 activations, on a CPU that quantises them), auto does not verify on it, though its plain decoding may be
    the fastest of any weights; a profile of such routes alone is one error line naming each route's check."""
    from specbench.hardware.measured.row_invariance import BITWISE, DIFFERS, ROUNDING, RowInvariance

    frame = hand_made_profile(fast_small="float32", fast_large="float32").latency
    rows = [frame.assign(backend="openvino", weights="int4_g64", ms=frame["ms"] * 0.6),
            frame.assign(backend="openvino", weights="w4a8_g64", ms=frame["ms"] * 0.4)]
    checks = {"openvino/float32/int4_g64": RowInvariance(ROUNDING, 3e-5, 20.0, 44, (30, 250)),
              "openvino/float32/w4a8_g64": RowInvariance(DIFFERS, 0.84, 20.0, 44, (30, 250))}
    profile = MachineProfile(machine_info(), "cpu", "tiny_random", hand_made_profile("float32", "float32").peaks,
                             pd.concat(rows, ignore_index=True), rows=checks)
    execution = plan("float32", "openvino", profile, 8, 256, "auto", ["int4_g64", "w4a8_g64"])
    assert execution.weights == "int4_g64" and execution.fastest_plain[2] == "w4a8_g64"
    assert "not lossless here, so not chosen: openvino/float32/w4a8_g64" in execution.reason
    assert plan("float32", "openvino", profile, 8, 256, "auto").weights == "int4_g64"  # every measured format
    with pytest.raises(SpecbenchError, match="no lossless verify route among openvino/float32/w4a8_g64 on this "
                                             "machine: openvino/float32/w4a8_g64: rows differ .* by up to 0.84"):
        plan("float32", "openvino", profile, 8, 256, "auto", ["w4a8_g64"])
    # the same route found bitwise on another CPU (one without int8 activations) is chosen there
    checks["openvino/float32/w4a8_g64"] = RowInvariance(BITWISE, 0.0, 20.0, 44, (30, 250))
    assert plan("float32", "openvino", profile, 8, 256, "auto").weights == "w4a8_g64"


def test_a_run_chooses_among_the_executions_it_asked_the_profile_for_not_what_other_runs_measured():
    """A cached profile holds every run's measurements: an openvino one from a run in another environment, faster
    here, is not chosen by a run whose backends are eager (a fresh clone without OpenVINO failed on it)."""
    frame = hand_made_profile(fast_small="float32", fast_large="float32").latency
    profile = MachineProfile(machine_info(), "cpu", "tiny_random", hand_made_profile("float32", "float32").peaks,
                             pd.concat([frame, frame.assign(backend="openvino", ms=frame["ms"] * 0.3)],
                                       ignore_index=True))
    assert plan("float32", "auto", profile, 8, 256, "fp").backend == "openvino"
    asked = profile.only(backends=["eager"], dtypes=None, weights=["fp"])
    assert {e.backend for e in asked.executions} == {"eager"}
    assert plan("float32", "auto", asked, 8, 256, "fp").backend == "eager"


def test_tau_and_per_depth_acceptance_from_hand_made_records():
    """Two steps of an unbalanced tree: step 1 accepts 2 drafts and its depth-2 node is a leaf (nothing tried at
    depth 3 although the tree reaches depth 4); step 2 accepts 1 draft and its node's children were tried. The steps
    gained 3 + 2 tokens, but max_new_tokens cut the output at 4 (1 from prefill + 3)."""
    row = {"method": "m", "question_id": "q", "turn": 0, "prompt_len": 10, "new_tokens": 4, "steps": 2, "accept_lengths": [3, 2],
           "tree_depths": [4, 4], "tried_deeper": [False, True], "tree_sizes": [8, 8], "wall_time": 1.0,
           "prefill_time": 0.1, "draft_time": 0.0, "verify_time": 0.5, "framework_times": [0.0, 0.0],
           "output_ids": [1, 2, 3, 4], "kv_peak_bytes": 0, "drafter_params": 0, "drafter_bytes": 0,
           "lossless_rule": True, "temperature": 0.0, "token_logprobs": []}
    frame = pd.DataFrame([row])
    # depth 1: eligible 2, accepted 2; depth 2: eligible 2 (step 1 accepted it, step 2 tried it), accepted 1;
    # depth 3: step 1's depth-2 node is a leaf, step 2 stopped at depth 1: nobody eligible -> the curve ends
    assert per_depth_acceptance(frame) == [1.0, 0.5]
    legacy = frame.drop(columns=["tried_deeper"])  # by tree depth alone, step 1 counts as a failure at depth 3
    assert per_depth_acceptance(legacy) == [1.0, 0.5, 0.0]
    summary = summarize(frame.assign(method="plain")).iloc[0]
    assert summary["tau"] == pytest.approx((4 - 1) / 2)  # emitted decode tokens per step, not the 5 accepted


def test_batched_evaluation_stays_lossless_and_reports_throughput(tmp_path):
    overrides = [*FAST, "eval.batch_size=3", "eval.num_prompts=4", "eval.latency_profile=false",
                 "eval.first_turn_only=false"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path)).set_index("method")
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == 16 and {r["batch_size"] for r in records} == {3, 1}  # 4 prompts = a batch of 3 and of 1
    assert summary.loc["pld", "lossless_match"] == 1.0  # both turns, every sequence
    per_batch = {r["batch_id"]: r["batch_wall_time"] for r in records if r["method"] == "pld"}
    tokens = sum(r["new_tokens"] for r in records if r["method"] == "pld")
    assert summary.loc["pld", "throughput_tokens_per_s"] == pytest.approx(tokens / sum(per_batch.values()))
    assert summary.loc["pld", "throughput_tokens_per_s"] > summary.loc["pld", "tokens_per_s"]  # sequences overlap


def test_transformers_generate_runs_beside_our_plain_decoding_and_matches_it(tmp_path):
    overrides = [*FAST, "eval.hf_generate=true", "eval.num_prompts=2", "eval.first_turn_only=true"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert list(summary.index) == ["plain", "pld", "hf_generate"]
    assert summary.loc["hf_generate", "identical"] == 1.0  # greedy generate() = our loop with no drafts
    assert summary.loc["hf_generate", "tau"] == pytest.approx(1.0) and summary.loc["hf_generate", "tokens_per_s"] > 0
    with pytest.raises(SpecbenchError, match="eval.hf_generate compares greedy decoding; sampling.temperature=0.7"):
        eval_task.run(compose_cfg([*overrides, "sampling=sample", "sampling.temperature=0.7"], tmp_path / "r2"))


def test_projected_speedup_includes_the_drafters_own_cost():
    """A hand-made roofline: a forward of n rows costs n ms, each draft-model forward 10 ms more, each Medusa head
    5 ms. Every method gains 4 decode tokens in 2 steps of 5 rows (tau 2). The draft model drafted 2 levels deep in
    one step and 4 in the other (one forward per level): its mean step is 5 + (20 + 40) / 2 = 35 ms, so
    2 * 1 / 35; Medusa's 4 heads make it 5 + 20 = 25 ms, 2 / 25; PPD's prompt tokens are among its 5 rows: 2 / 5."""
    def step_s(n, context, drafter=None):
        extra = 0 if drafter is None else 10 * drafter.draft_forwards + 5 * drafter.medusa_heads
        return (n + extra) / 1e3

    def row(method, depths, sizes, gained=2):
        return {"method": method, "question_id": "q", "turn": 0, "prompt_len": 10,
                "new_tokens": 1 + gained * len(sizes), "steps": len(sizes), "accept_lengths": [gained] * len(sizes),
                "tree_depths": depths,
                "tried_deeper": [True] * len(sizes), "tree_sizes": sizes, "wall_time": 1.0, "prefill_time": 0.1,
                "draft_time": 0.0, "verify_time": 0.5, "framework_times": [0.0] * len(sizes),
                "output_ids": [1], "kv_peak_bytes": 0, "drafter_params": 0, "drafter_bytes": 0,
                "lossless_rule": True, "temperature": 0.0, "token_logprobs": []}

    frame = pd.DataFrame([row("plain", [0] * 4, [1] * 4, gained=1), row("draft", [2, 4], [5, 5]),
                          row("medusa", [3, 3], [5, 5]), row("ppd", [2, 2], [5, 5])])
    costs = {"draft": DrafterCost(draft=named_shape("smollm2_135m")), "medusa": DrafterCost(medusa_heads=4)}
    summary = summarize(frame, projected_step=step_s, drafter_costs=costs).set_index("method")
    assert summary.loc["plain", "projected_speedup"] == pytest.approx(1.0)
    assert summary.loc["draft", "projected_speedup"] == pytest.approx(2 * 1 / 35)
    assert summary.loc["medusa", "projected_speedup"] == pytest.approx(2 * 1 / 25)
    assert summary.loc["ppd", "projected_speedup"] == pytest.approx(2 * 1 / 5)
    assert summary.loc["draft", "projected_tokens_per_s"] == pytest.approx(2 / 0.035)


def test_a_named_backend_outside_the_profiled_ones_is_measured_beside_them(tmp_path, monkeypatch):
    """On the H100, model.backend=compile with eval.profile_backends=[eager] ended in 'the machine profile has no
    execution compile/bfloat16': the run's own backend must be measured too, even when the fastest plain decoding
    is chosen among other backends."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    path = profile_path("tiny_random", "cpu")
    path.parent.mkdir(parents=True)
    path.write_text(hand_made_profile(fast_small="float32", fast_large="float32").to_json())
    overrides = [*FAST, "model.backend=prepacked", "eval.fastest_plain=true", "eval.profile_backends=[eager]",
                 "eval.profile_weights=[fp]", "eval.num_prompts=1", "eval.max_new_tokens=8", "eval.first_turn_only=true"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert summary.loc["pld", "backend"] == "prepacked"
    measured = MachineProfile.from_json(path.read_text()).executions
    assert ("prepacked", "float32", "fp") in measured and ("eager", "bfloat16", "fp") in measured


@pytest.mark.slow
def test_a_run_that_chooses_nothing_profiles_only_its_own_execution(tmp_path, monkeypatch):
    """A fixed backend and dtype without the fastest plain decoding need L(n) of that execution alone (here for the
    hardware-aware tree): profiling every dtype made the H100's compiled run spend its time compiling three."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    acc = [[0.6, 0.2], [0.5, 0.2]]
    overrides = [*FAST, "method=draft_model", "method.checkpoint=null", "method.draft.early_exit_layers=1",
                 "tree=hardware_aware", f"tree.accept_prob={acc}", "tree.budget=4", "eval.num_prompts=1",
                 "eval.max_new_tokens=8", "eval.first_turn_only=true", "eval.profile_weights=[fp]",
                 "eval.profile_backends=[eager,prepacked]", "model.backend=eager"]
    eval_task.run(compose_cfg(overrides, tmp_path / "run"))
    profile = MachineProfile.from_json(profile_path("tiny_random", "cpu").read_text())
    assert profile.executions == [("eager", "float32", "fp")]


def test_the_why_line_explains_methods_not_plain_decoding_on_a_slower_execution():
    from specbench.evaluation.summary import _why_slower

    row = {"fastest_plain": "plain@float16", "decode_tokens_per_s": 20.0, "draft_ms_per_step": 0.2}
    summary = pd.DataFrame([
        {**row, "method": "plain", "speedup": 0.91, "tau": 1.0, "mean_tree_size": 1.0},
        {**row, "method": "plain@float16", "speedup": 1.0, "tau": 1.0, "mean_tree_size": 1.0,
         "decode_tokens_per_s": 22.0},
        {**row, "method": "eagle", "speedup": 0.57, "tau": 2.7, "mean_tree_size": 64.0, "decode_tokens_per_s": 12.0,
         "draft_ms_per_step": 144.0}])
    lines = _why_slower(summary)
    assert len(lines) == 1 and lines[0].startswith("eagle is slower than plain@float16")
    assert "144.0 ms of drafting" in lines[0]


def test_a_run_profiles_the_sizes_up_to_its_largest_tree():
    """A first run measures L(n) only up to the size its trees read (PLD's 11 rows: up to 16), not every size."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from specbench.evaluation.plan import profile_sizes

    cfg = OmegaConf.create({"eval": {"profile_sizes": [1, 2, 4, 8, 16, 32, 64]}})
    trees = [SimpleNamespace(budget=b) for b in (5, 11)]
    assert profile_sizes(cfg, trees) == [1, 2, 4, 8, 16]
    assert profile_sizes(cfg, [SimpleNamespace(budget=64)]) == [1, 2, 4, 8, 16, 32, 64]
    assert profile_sizes(cfg, [SimpleNamespace(budget=100)]) == [1, 2, 4, 8, 16, 32, 64]
    assert profile_sizes(cfg, [SimpleNamespace(budget=2)]) == [1, 2]
    cfg.eval.profile_sizes = [4, 8]  # L(1) is always measured: the fastest plain decoding is judged by it
    assert profile_sizes(cfg, [SimpleNamespace(budget=6)]) == [1, 4, 8]
