"""Hardware modelling: spec validation, the per-op roofline, projection, SSSD's threshold, Ghidorah, LLMCad, and
the measured machine profile (on the tiny model, with small microbenchmarks)."""

import dataclasses
import json
import re
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, build
from specbench.drafters.base import DrafterCost
from specbench.errors import SpecbenchError
from specbench.evaluation.plan import latency_curve
from specbench.hardware.measured import machine_profile, with_measurements
from specbench.hardware.measured.machine import fingerprint
from specbench.hardware.measured.choice import choose_execution
from specbench.hardware.measured.machine_profile import MachineProfile, load_or_measure_profile
from specbench.hardware.modelled import ghidorah, llmcad
from specbench.hardware.modelled.ops import op_costs, roofline_ops
from specbench.hardware.modelled.roofline import project, roofline_step_time, sssd_free_budget
from specbench.hardware.modelled.spec import MEASURED, HardwareSpec
from specbench.execution.backends import supported
from specbench.models.shape import ModelShape, named_shape
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
HW_DIR = CONF_DIR / "hw"
FIGURES = dict(peak_tflops={"float16": 100.0, "float32": 10.0}, mem_bandwidth_gbs=1000.0, layer_overhead_ms=0.0,
               memory_gb=16.0, storage_bandwidth_gbs=1.0)
FAKE_PEAKS = {"peak_tflops": {"float32": 0.2, "bfloat16": 0.8}, "mem_bandwidth_gbs": 40.0, "layer_overhead_ms": 0.1,
              "memory_gb": 16.0}


def board(name: str) -> HardwareSpec:
    return with_measurements(build(OmegaConf.load(HW_DIR / f"{name}.yaml")))


def simple(**kw) -> HardwareSpec:
    return HardwareSpec(name="toy", **{**FIGURES, **kw})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private specbench cache holding this machine's peaks, so hw=cpu reads them without measuring."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / f"{fingerprint()}-cpu-peaks.json").write_text(json.dumps({"peaks": FAKE_PEAKS}))
    return tmp_path


# --- specs -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("missing", ["peak_tflops", "mem_bandwidth_gbs", "memory_gb", "storage_bandwidth_gbs",
                                     "layer_overhead_ms"])
def test_a_hw_file_missing_a_figure_names_it_in_one_line(missing, tmp_path):
    cfg = OmegaConf.load(HW_DIR / "jetson.yaml")
    del cfg[missing]
    with pytest.raises(SpecbenchError, match=missing) as err:
        build(cfg)
    assert "\n" not in str(err.value)


def test_a_negative_bandwidth_names_the_value():
    with pytest.raises(SpecbenchError, match=r"mem_bandwidth_gbs=-5.0 is invalid"):
        simple(mem_bandwidth_gbs=-5.0)
    with pytest.raises(SpecbenchError, match=r"unit gpu mem_bandwidth_gbs=-1"):
        simple(units=[{"name": "gpu", "kind": "gpu", "peak_tflops": {"float16": 1}, "mem_bandwidth_gbs": -1}])


def test_an_unknown_partition_names_it_and_the_valid_ones():
    with pytest.raises(SpecbenchError, match=r"hw.partition='ring' is unknown; valid: gpu_only, megatron, hcmp"):
        simple(partition="ring")
    with pytest.raises(SpecbenchError, match=r"'hcmp' splits work across units.*a100"):
        dict_cfg = OmegaConf.load(HW_DIR / "a100.yaml")
        dict_cfg.partition = "hcmp"
        build(dict_cfg)


def test_other_bad_figures_are_named():
    with pytest.raises(SpecbenchError, match=r"dtype 'fp8' is unknown"):
        simple(peak_tflops={"fp8": 1.0})
    with pytest.raises(SpecbenchError, match=r"no peak for dtype 'int8'"):
        simple().peak_flops("int8")
    with pytest.raises(SpecbenchError, match=r"unit kind 'tpu' is unknown"):
        simple(units=[{"name": "x", "kind": "tpu", "peak_tflops": {"float16": 1}, "mem_bandwidth_gbs": 1}])
    with pytest.raises(SpecbenchError, match=r"storage_bandwidth_gbs=measured is not supported"):
        simple(storage_bandwidth_gbs="measured")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_hw_cuda_without_a_gpu_stops_in_activate():
    hw = build(compose_cfg(["hw=cuda"]).hw)  # instantiating is fine: nothing is measured until a figure is read
    with pytest.raises(SpecbenchError, match="no CUDA device"):
        hw.activate()
    with pytest.raises(SpecbenchError, match="no CUDA device"):
        hw.figure("peak_tflops")


@pytest.mark.slow
def test_bad_hw_input_ends_in_one_error_line_from_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "run.py", "task=hardware", "hw=jetson", "hw.partition=ring",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    expect = "error: hw.partition='ring' is unknown; valid: gpu_only, megatron, hcmp"
    assert done.stderr.strip().splitlines() == [expect]


def test_every_figure_in_a_hw_file_carries_a_source_comment():
    for path in HW_DIR.glob("*.yaml"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(r":\s*[-\d{]", line) and not line.lstrip().startswith("#"):
                assert "#" in line or lines[i - 1].lstrip().startswith("#"), f"{path.name}: '{line}' has no source"


def test_measured_specs_read_the_cached_profile(cache):
    hw = board("cpu")
    assert hw.figure("peak_tflops") == FAKE_PEAKS["peak_tflops"] and hw.figure("mem_bandwidth_gbs") == 40.0
    assert hw.figure("layer_overhead_ms") == pytest.approx(0.1) and hw.figure("memory_gb") == 16.0
    assert hw.figure("storage_bandwidth_gbs") == board("cpu").storage_bandwidth_gbs  # never measured
    with pytest.raises(SpecbenchError, match="hw figure 'memory' is unknown; valid: peak_tflops"):
        hw.figure("memory")


def test_measure_peaks_returns_positive_figures_quickly():
    peaks = machine_profile.measure_peaks("cpu", dtypes=["float32"], matmul_size=128, read_mb=8, budget_s=0.05)
    assert peaks["peak_tflops"]["float32"] > 0 and peaks["mem_bandwidth_gbs"] > 0
    assert peaks["layer_overhead_ms"] >= 0 and peaks["memory_gb"] > 0


# --- roofline ----------------------------------------------------------------------------------------------------

TOY = ModelShape(params=10_000_000, layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                 vocab=1000, dtype="float16")


def test_op_costs_follow_the_formulas():
    ops = op_costs(TOY, tokens=8, context=100, batch=2).set_index("op")
    rows = 16
    assert ops.at["qkv_proj", "flops"] == 2 * rows * 256 * (4 + 2 * 2) * 64 * 2
    assert ops.at["qkv_proj", "weight_bytes"] == 256 * 512 * 2 * 2
    assert ops.at["mlp", "flops"] == 3 * 2 * rows * 256 * 512 * 2
    assert ops.at["attn_cache", "flops"] == 4 * 2 * 4 * 64 * 2 * 8 * 100
    assert ops.at["attn_tree", "flops"] == 4 * 2 * 4 * 64 * 2 * 64  # masked dense 8 x 8
    assert ops.at["lm_head", "flops"] == 2 * rows * 256 * 1000
    assert ops.at["attn_cache", "bytes"] == 2 * (2 * 2 * 64 * 2 * 2 * 100) + 2 * rows * 4 * 64 * 2 * 2
    sparse = op_costs(TOY, 8, 100, 2, tree_nnz=20).set_index("op")
    assert sparse.at["attn_tree", "flops"] == 4 * 2 * 4 * 64 * 2 * 20
    assert op_costs(TOY, 8, 100, 2, dtype="int4").set_index("op").at["lm_head", "weight_bytes"] == 256 * 1000 * 0.5


def test_step_time_sums_per_op_roofs_plus_the_layer_overhead():
    hw = simple(layer_overhead_ms=0.5)
    ops = op_costs(TOY, 4, 64)
    expect = sum(max(f / 100e12, b / 1000e9) for f, b in zip(ops["flops"], ops["bytes"])) + 2 * 0.5e-3
    assert roofline_step_time(TOY, hw, 4, 64) == pytest.approx(expect)
    breakdown = roofline_ops(TOY, hw, 4, 64)
    assert breakdown["seconds"].sum() == pytest.approx(expect)
    assert set(breakdown.loc[breakdown["op"] != "overhead", "bound"]) == {"memory"}
    assert roofline_ops(TOY, hw, 4096, 64).set_index("op").at["mlp", "bound"] == "compute"
    f = partial(roofline_step_time, TOY, hw)  # how tasks/eval.py calls it
    assert f(1, 128) < f(64, 128)


def test_drafter_costs_are_priced():
    hw = simple()
    base = roofline_ops(TOY, hw, 8, 64).set_index("op")
    medusa = roofline_ops(TOY, hw, 8, 64, drafter=DrafterCost(medusa_heads=3)).set_index("op")
    assert medusa.at["medusa_resblocks", "weight_bytes"] == 3 * 256 * 256 * 2
    assert medusa.at["medusa_lm_heads", "flops"] == 3 * 2 * 8 * 256 * 1000
    draft = ModelShape(1_000_000, 1, 64, 2, 2, 32, 128, 1000, "float16")
    with_draft = roofline_ops(TOY, hw, 8, 64, drafter=DrafterCost(draft=draft, draft_forwards=3)).set_index("op")
    assert [o for o in with_draft.index if o.startswith("draft_")] == ["draft_forward_1", "draft_forward_2",
                                                                        "draft_forward_3"]
    assert with_draft.at["draft_forward_1", "flops"] == op_costs(draft, 1, 64)["flops"].sum()
    ppd = roofline_ops(TOY, hw, 8, 64, drafter=DrafterCost(prompt_tokens=4)).set_index("op")
    assert ppd.at["mlp", "flops"] == op_costs(TOY, 12, 64).set_index("op").at["mlp", "flops"]
    assert ppd.at["mlp", "flops"] > base.at["mlp", "flops"]


def test_model_shape_of_the_tiny_model(tiny):
    s = ModelShape.of(tiny.model)
    cfg = tiny.model.config
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.intermediate, s.vocab, s.dtype) == (
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
        cfg.intermediate_size, cfg.vocab_size, "float32")
    assert s.params == sum(p.numel() for p in tiny.model.parameters())
    with pytest.raises(SpecbenchError, match="model shape 'llama9' is unknown"):
        named_shape("llama9")


# --- projection and SSSD -----------------------------------------------------------------------------------------

def test_projection_uses_the_boards_bytes_per_parameter():
    a100 = board("a100")
    local_fp32 = named_shape("llama2_7b").with_dtype("float32")
    got = project(local_fp32, a100, tau=2.5, tree_size=16)
    assert got["dtype"] == "float16"
    t1 = roofline_step_time(local_fp32, a100, 1, 256, dtype="float16")
    tn = roofline_step_time(local_fp32, a100, 16, 256, dtype="float16")
    assert got["projected_speedup"] == pytest.approx(2.5 * t1 / tn)
    assert got["projected_tokens_per_s"] == pytest.approx(2.5 / tn)
    assert got == project(named_shape("llama2_7b"), a100, 2.5, 16)  # the local dtype does not matter
    # 7B fp16 plain decoding on an A100 is bound by reading 13.5 GB at 1935 GB/s: about 7 ms
    assert got["projected_ar_ms"] == pytest.approx(13.48e9 / 1935e9 * 1e3, rel=0.15)
    with pytest.raises(SpecbenchError, match="tau >= 1"):
        project(local_fp32, a100, tau=0.5, tree_size=4)


@pytest.mark.parametrize("hw_name, paper", [("ascend_910b4", 435), ("a100", 175)])
def test_sssd_threshold_within_ten_percent_of_the_papers(hw_name, paper):
    """SSSD Sec. 3.2: 1 / (2 (1/h + 1/(2 b s_q))) = peak / bandwidth; about 435 for Llama-2-7B on the 910B4 (the
    paper's own figure) and 175 on the A100-80GB-PCIe (the same formula, ../shared/design/methods-medusa-sssd.md)."""
    hw = board(hw_name)
    got = sssd_free_budget(named_shape("llama2_7b"), hw)
    ridge = {"ascend_910b4": 280e12 / 800e9, "a100": 312e12 / 1935e9}[hw_name]
    assert got["qkvo"] == pytest.approx(1 / (1 / ridge - 2 / 4096))
    assert abs(got["qkvo"] - paper) / paper < 0.10
    # the per-op roofline agrees: O's projection (h x h, Table 1) turns compute-bound at the threshold
    o = {r: roofline_ops(named_shape("llama2_7b"), hw, r, 1024).set_index("op").at["o_proj", "bound"]
         for r in (int(got["qkvo"]) - 2, int(got["qkvo"]) + 3)}
    assert list(o.values()) == ["memory", "compute"]


# --- Ghidorah ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dataset", ["mt_bench", "mbpp"])
def test_ghidorah_hcmp_picks_a_smaller_width_than_gpu_only_on_jetson(dataset):
    sweep = ghidorah.arca_search(named_shape("llama2_7b"), board("jetson"), ghidorah.GHIDORAH_TAU[dataset])
    split = ghidorah.speedup_split(sweep).set_index("partition")
    assert split.at["hcmp", "best_width"] < split.at["gpu_only", "best_width"]
    assert (split.at["gpu_only", "best_width"], split.at["hcmp", "best_width"]) == (64, 16)  # as the paper
    for _, row in split.iterrows():
        assert row["speedup"] == pytest.approx(row["algorithmic"] * row["verify_cost"] * row["parallel"])
    assert split.at["hcmp", "parallel"] > 1.5  # the CPU adds its own bandwidth while decoding is memory-bound


def test_a_partitioned_board_prices_forwards_at_arcas_best_split():
    cfg = OmegaConf.load(HW_DIR / "jetson.yaml")
    gpu_only, llama = build(cfg), named_shape("llama2_7b")
    cfg.partition = "hcmp"
    hcmp = build(cfg)
    ratio, seconds = ghidorah.best_split(llama, hcmp, 16, 256, "hcmp", heads=0)
    assert 0 < ratio < 1 and roofline_step_time(llama, hcmp, 16, 256) == pytest.approx(seconds)
    assert roofline_step_time(llama, hcmp, 16, 256) < 0.6 * roofline_step_time(llama, gpu_only, 16, 256)
    assert ghidorah.best_split(llama, hcmp, 16, 256, "hcmp", heads=0, ratios=[0.0])[1] > seconds
    with pytest.raises(SpecbenchError, match="hw.partition='hcmp' models batch-1"):
        roofline_step_time(llama, hcmp, 16, 256, batch=2)


def test_ghidorah_bad_input_is_named():
    jetson = board("jetson")
    with pytest.raises(SpecbenchError, match="hw.partition='ring' is unknown"):
        ghidorah.best_split(named_shape("llama2_7b"), jetson, 16, 256, "ring")
    with pytest.raises(SpecbenchError, match="widths in 1..64"):
        ghidorah.arca_search(named_shape("llama2_7b"), jetson, {128: 4.0})
    with pytest.raises(SpecbenchError, match=r"hw 'a100' has no gpu unit \(units: none\)"):
        ghidorah.best_split(named_shape("llama2_7b"), board("a100"), 16, 256, "hcmp")


# --- LLMCad ------------------------------------------------------------------------------------------------------

def test_llmcad_streams_what_does_not_fit_in_the_memory_the_target_may_occupy():
    target, draft = named_shape("llama2_7b"), named_shape("tinyllama_1.1b")
    jetson = dataclasses.replace(board("jetson"), memory_gb=4)  # hw.memory_gb=4: LLMCad's 4 GB budget
    frame = llmcad.streaming_latency(target, draft, jetson, tau=2.5, draft_len=4)
    kv = sum(2 * s.layers * s.kv_heads * s.head_dim * 2 * 260 for s in (target, draft))
    streamed = target.weight_bytes - (4e9 - draft.weight_bytes - kv)
    assert frame.attrs["streamed_gb"] == pytest.approx(streamed / 1e9)
    rows = frame.set_index("scenario")["per_token_ms"]
    load_ms = streamed / 0.4e9 * 1e3
    assert rows["plain decoding, streaming"] == pytest.approx(load_ms + rows.iloc[0])
    assert rows.iloc[3] <= rows.iloc[2] < rows.iloc[1]  # overlap never hurts; speculation divides the loads
    assert frame.attrs["memory_gb"] == 4
    with pytest.raises(SpecbenchError, match="do not fit in a 1.0 GB budget"):
        llmcad.streaming_latency(target, draft, dataclasses.replace(jetson, memory_gb=1), tau=2.5, draft_len=4)


# --- machine profile ---------------------------------------------------------------------------------------------

def toy_profile() -> MachineProfile:
    rows = [("float32", c, n, 50 + 2 * n + c / 100) for c in (128, 1024) for n in (1, 8, 32)]
    rows += [("bfloat16", c, n, 30 + 10 * (n - 1) + c / 100) for c in (128, 1024) for n in (1, 8, 32)]
    frame = pd.DataFrame(rows, columns=["dtype", "context", "tokens", "ms"])
    return MachineProfile({}, "cpu", "toy", FAKE_PEAKS, frame)


def test_latency_is_interpolated_in_n_and_context():
    p = toy_profile()
    assert p.latency_ms("float32", 8, 128) == pytest.approx(50 + 16 + 1.28)
    assert p.latency_ms("float32", 4, 128) == pytest.approx(50 + 8 + 1.28)  # between measured sizes
    assert p.latency_ms("float32", 8, 576) == pytest.approx(50 + 16 + 5.76)  # between contexts
    assert p.latency_ms("float32", 64, 2048) == pytest.approx(50 + 128 + 20.48)  # extrapolated linearly
    curve = p.curve("bfloat16", 128)
    assert list(curve["tokens"]) == [1, 8, 32] and list(curve["ms"]) == pytest.approx([31.28, 101.28, 341.28])
    with pytest.raises(SpecbenchError, match="no execution 'eager/float16'; it has: eager/float32, eager/bfloat16"):
        p.latency_ms("float16", 1, 128)


def test_choose_execution_minimises_the_verify_forward_and_names_the_fastest_plain_decoding():
    p = toy_profile()
    (backend, dtype, weights), reason = choose_execution(p, 1, 128)
    assert (backend, dtype, weights) == ("eager", "bfloat16", "fp")  # L(1): 31.3 vs 53.3
    (backend, dtype, weights), reason = choose_execution(p, 8, 128)
    assert dtype == "float32"  # L(8): 67.3 vs 101.3
    assert "L(8)" in reason and "67.3 ms" in reason and "fastest plain decoding is eager/bfloat16 at L(1) = 31.3 ms" in reason


def test_choose_execution_weighs_backends_against_dtypes_and_keeps_to_the_allowed_ones():
    """A compiled fp32 forward that is flat in n beats eager bf16 for trees but not for one token."""
    p = toy_profile()
    compiled = p.latency[p.latency["dtype"] == "float32"].assign(backend="compile", ms=lambda f: 35 + 0.5 * f["tokens"])
    p = MachineProfile({}, "cpu", "toy", FAKE_PEAKS, pd.concat([p.latency, compiled], ignore_index=True))
    assert ("compile", "float32", "fp") in p.executions
    assert choose_execution(p, 8, 128)[0][:2] == ("compile", "float32")  # 39 vs eager fp32 67.3, bf16 101.3
    assert choose_execution(p, 1, 128)[0][:2] == ("eager", "bfloat16")  # 31.3 vs compiled 35.5
    assert choose_execution(p, 8, 128, backends=["eager"])[0][:2] == ("eager", "float32")
    assert choose_execution(p, 8, 128, dtypes=["bfloat16"])[0][:2] == ("eager", "bfloat16")
    with pytest.raises(SpecbenchError, match="no measurement for backend \\['prepacked'\\]"):
        choose_execution(p, 8, 128, backends=["prepacked"])


def test_latency_profile_over_contexts_with_min_or_median(tiny):
    from specbench.hardware.measured.profiler import latency_profile

    fast = latency_profile(tiny.model, sizes=[1, 2], context=[8, 16], repeats=3, statistic="min")
    assert list(zip(fast["context"], fast["tokens"])) == [(8, 1), (8, 2), (16, 1), (16, 2)]
    assert (fast["ms"] > 0).all()


def test_profile_is_measured_once_and_then_loaded(tiny, cache, monkeypatch):
    monkeypatch.setattr(machine_profile, "measure_peaks", lambda device: FAKE_PEAKS)  # tested above, at small sizes
    monkeypatch.setattr(machine_profile, "busy", lambda machine: False)  # other work on the test machine is no matter
    # nor is it whether one tiny execution times 2x another beside a busy test worker (dominance: test_machine_profile)
    monkeypatch.setattr(machine_profile, "_dominated", lambda *args: None)
    profile = load_or_measure_profile(tiny, dtypes=["float32", "bfloat16"], sizes=[1, 4], contexts=[8, 16],
                                      repeats=1, backends=["eager", "prepacked"])
    packs_bf16 = supported("prepacked", torch.bfloat16, torch.device("cpu")) is None  # AVX-512 or AVX-NE-CONVERT
    measured = {("eager", "float32", "fp"), ("eager", "bfloat16", "fp"), ("prepacked", "float32", "fp")} | (
        {("prepacked", "bfloat16", "fp")} if packs_bf16 else set())
    assert set(profile.executions) == measured and len(profile.latency) == 4 * len(measured)
    assert packs_bf16 or "oneDNN cannot pack" in profile.machine["unsupported"]["prepacked/bfloat16"]
    assert (profile.latency["ms"] > 0).all() and profile.peaks == FAKE_PEAKS
    assert len(profile.machine["loadavg_1min"]) == 2  # how busy the machine was, kept with the numbers
    assert next(tiny.model.parameters()).dtype == torch.float32  # the target itself was not cast
    path = machine_profile.profile_path(tiny.name, "cpu")
    assert path.parent == cache / "profiles" and path.name.endswith(f"-cpu-{tiny.name}.json")
    assert path.exists()
    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: pytest.fail("measured again"))
    again = load_or_measure_profile(tiny, dtypes=["float32", "bfloat16"], sizes=[4], contexts=[16],
                                    backends=["prepacked"])
    pd.testing.assert_frame_equal(again.latency, profile.latency)


# --- tasks -------------------------------------------------------------------------------------------------------

def test_task_profile_writes_the_table_and_plot(tmp_path, cache, capsys, monkeypatch):
    monkeypatch.setattr(machine_profile, "measure_peaks", lambda device: FAKE_PEAKS)
    # whether one tiny execution times 2x another beside a busy test worker is no matter here (it dropped prepacked
    # once in CI: dominance is test_machine_profile's)
    monkeypatch.setattr(machine_profile, "_dominated", lambda *args: None)
    from specbench.tasks import profile as task

    cfg = compose_cfg(["task=profile", "model=tiny_random", "eval.profile_sizes=[1,2]", "eval.profile_repeats=1",
                       "eval.profile_contexts=[8]", "eval.dtype=float32", "model.backend=prepacked"],
                      tmp_path / "run")
    errors = task.run(cfg)
    assert {"ms", "roofline_ms", "bound_ms", "error_pct"} <= set(errors.columns)
    assert (errors["bound_ms"] < errors["roofline_ms"]).all()  # the fixed per-layer cost is left out of the bound
    for name in ("machine_profile.json", "profile_vs_roofline.csv", "profile_vs_roofline.png", "weight_streaming.csv",
                 "row_invariance.csv"):
        assert (tmp_path / "run" / name).exists()
    assert set(errors["backend"]) == {"eager", "prepacked"}  # the asked backend beside the eager reference
    out = capsys.readouterr().out
    assert "choose_execution(tree_size=8)" in out
    checks = pd.read_csv(tmp_path / "run" / "row_invariance.csv").set_index("execution")
    assert set(checks.index) == {"eager/float32", "prepacked/float32"} and (checks["rows"] > 0).all()
    assert "row check: each execution's verify rows" in out


def test_task_hardware_on_jetson(tmp_path, cache, capsys):
    from specbench.tasks import hardware as task

    tables = task.run(compose_cfg(["task=hardware", "hw=jetson"], tmp_path / "run"))
    split = tables["ghidorah"].set_index("partition")
    assert split.at["hcmp", "best_width"] < split.at["gpu_only", "best_width"]
    for name in ("roofline.png", "ghidorah_widths.png", "sssd_threshold.png", "llmcad.csv", "projection.csv"):
        assert (tmp_path / "run" / name).exists()
    assert "PROJECTED" in capsys.readouterr().out
    with pytest.raises(SpecbenchError, match="hardware.tau='gsm9k' is unknown"):
        task.run(compose_cfg(["task=hardware", "hw=jetson", "+hardware.tau=gsm9k"], tmp_path / "run2"))


def test_a_sized_draft_reads_the_cost_of_the_rows_the_target_pads_a_call_to():
    """L(n) between two measured row counts is not a line where the target runs n rows padded to a compiled count:
    5 rows on OpenVINO's static models cost the 8-row model's step."""
    machine = SimpleNamespace(latency_ms=lambda dtype, n, context, backend, weights: 10.0 + n)
    execution = SimpleNamespace(dtype="float32", backend="openvino", weights="int8")
    hw = SimpleNamespace(peak_tflops=MEASURED)
    padded = SimpleNamespace(model=SimpleNamespace(padded_rows=lambda n: 8 if 4 < n <= 8 else n))
    assert [latency_curve(hw, machine, padded, execution, 128)(n) for n in (3, 5)] == [13.0, 18.0]
    eager = SimpleNamespace(model=SimpleNamespace())
    assert latency_curve(hw, machine, eager, execution, 128)(5) == 15.0


def test_a_runtime_running_its_own_graph_is_bounded_without_pytorchs_dispatch_at_the_fastest_multiply():
    """The run's latency plot prices an openvino or onnxruntime step: hw=cpu's per-layer cost is PyTorch's eager
    dispatch, and its int4 peak PyTorch's weight-only kernel, neither of which such a runtime runs; with them the
    roofline of SmolLM2's int4 step lay above the step measured. The bound keeps hw's bandwidth."""
    from specbench.evaluation.summary import _own_graph_bound

    hw = simple(peak_tflops={"float32": 0.3, "int4": 0.13, "w8a8": 0.45}, mem_bandwidth_gbs=20.0,
                layer_overhead_ms=0.47)
    bound = _own_graph_bound(hw)
    assert bound.layer_overhead_ms == 0.0 and bound.mem_bandwidth_gbs == 20.0
    assert bound.peak_tflops == {"float32": 0.45, "int4": 0.45, "w8a8": 0.45}
    shape = named_shape("smollm2_135m")
    one, four = ([1e3 * roofline_step_time(shape, h, n, 192, dtype="int4_g32") for h in (hw, bound)] for n in (1, 4))
    assert four[1] < four[0] and one[1] < one[0]
    assert four[1] < 1.05 * one[1] < four[0]  # at the int8 multiply four rows read what one reads: memory-bound
