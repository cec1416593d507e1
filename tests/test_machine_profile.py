"""The machine-profile cache can be trusted: written atomically, checked when read (a bad file is measured again with
a one-line notice, never a traceback), and L(n, context) positive and monotone, never extrapolated below the
measured range."""

import importlib.util
import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from specbench.errors import SpecbenchError
from specbench.execution.value import Execution
from specbench.files import write_atomic
from specbench.hardware.measured import cache, machine_profile, peaks
from specbench.hardware.measured.machine import fingerprint
from specbench.hardware.measured.machine_profile import MachineProfile, load_or_measure_profile, profile_path
from specbench.hardware.measured.peaks import measured_peaks
from specbench.models.loading import cache_root

PEAKS = {"peak_tflops": {"float32": 0.2}, "mem_bandwidth_gbs": 40.0, "layer_overhead_ms": 0.1, "memory_gb": 16.0}
SIZES, CONTEXTS = [1, 4], [8, 16]


def fake_latency(model, sizes, contexts, repeats, statistic):
    """A cheap stand-in for timing forwards: 10 ms + 1 per token + 0.1 per context token."""
    return pd.DataFrame([{"context": c, "tokens": n, "ms": 10.0 + n + c / 10} for c in contexts for n in sizes])


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    """A private cache, and measuring that costs nothing and counts how often it runs."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(machine_profile, "measure_peaks", lambda device: PEAKS)
    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: calls.append(a) or fake_latency(*a, **k))
    monkeypatch.setattr(machine_profile, "busy", lambda machine: False)
    return calls


def load(tiny):
    return load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                   backends=["eager"])


def grid_profile(ms: dict) -> MachineProfile:
    """A float32 eager profile from {(tokens, context): ms}."""
    frame = pd.DataFrame([{"backend": "eager", "dtype": "float32", "context": c, "tokens": n, "ms": v}
                          for (n, c), v in ms.items()])
    return MachineProfile({}, "cpu", "toy", PEAKS, frame)


def test_a_dtype_asked_for_is_measured_however_fast_a_cached_other_dtype_ran(tiny, measuring, monkeypatch):
    """A profile in bfloat16, then one asked for float32 alone (task=profile eval.dtype=float32 on a GPU, where bf16
    runs 3x faster): float32 is measured, not recorded as dominated by the cached bfloat16 curve."""
    def slow_fp32(model, sizes, contexts, repeats, statistic):
        frame = fake_latency(model, sizes, contexts, repeats, statistic)
        return frame.assign(ms=frame["ms"] * 3) if next(model.parameters()).dtype == torch.float32 else frame

    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: measuring.append(a) or slow_fp32(*a, **k))
    load_or_measure_profile(tiny, dtypes=["bfloat16"], sizes=SIZES, contexts=CONTEXTS, repeats=1, backends=["eager"])
    profile = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                      backends=["eager"])
    assert "eager/float32" not in profile.machine.get("unsupported", {})
    assert {("eager", "bfloat16", "fp"), ("eager", "float32", "fp")} <= set(profile.executions)


def test_a_quantised_execution_slower_at_both_ends_is_recorded_not_measured(tiny, measuring, monkeypatch):
    """int8 weights made 3x slower than the float model at every size: one probe at the smallest and largest size,
    then a reason in the profile instead of a curve; int4, as fast as float, is measured; a rerun measures nothing."""
    from specbench.execution.quantize import Int8Linear

    def slow_int8(model, sizes, contexts, repeats, statistic):
        frame = fake_latency(model, sizes, contexts, repeats, statistic)
        return frame.assign(ms=frame["ms"] * 3) if any(isinstance(m, Int8Linear) for m in model.modules()) else frame

    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: measuring.append(a) or slow_int8(*a, **k))
    formats = ["fp", "int8", "int4_g32"]
    profile = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                      backends=["eager"], weights=formats)
    why = profile.machine["unsupported"]["eager/float32/int8"]
    assert why.startswith("dominated: L(1) 35 ms, L(4) 44 ms at context 8") and "(12, 15 ms)" in why
    assert set(profile.executions) == {("eager", "float32", "fp"), ("eager", "float32", "int4_g32")}
    assert len(measuring) == 4  # fp's curve, int8's probe, int4's probe and curve
    load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1, backends=["eager"],
                            weights=formats)
    assert len(measuring) == 4  # the reason counts as known: nothing is measured again


def test_the_own_graph_routes_refuse_a_sliding_window_cache_and_a_profile_of_nothing_is_one_line(tiny, measuring,
                                                                                                    capsys):
    """The openvino and onnxruntime routes keep one growing buffer per layer, which a sliding window's ring is not:
    the profile records why for a model with such layers (Gemma 3), auto then chooses among the rest, and a profile
    left with no execution at all says so in one line, naming the way out."""
    import dataclasses

    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=512,
                              layer_types=["sliding_attention", "full_attention"])
    sliding = dataclasses.replace(tiny, name="tiny_sliding", model=Gemma3ForCausalLM(config).eval())
    profile = load_or_measure_profile(sliding, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                      backends=["onnxruntime", "openvino", "eager"])
    assert set(profile.executions) == {("eager", "float32", "fp")}
    for backend in ("onnxruntime", "openvino"):
        assert profile.machine["unsupported"][f"{backend}/float32"] == (
            "its layers are full_attention, sliding_attention, and this route keeps full-attention caches only")
    with pytest.raises(SpecbenchError, match=r"^the machine profile of tiny_sliding has no execution this machine can "
                                             r"run \(onnxruntime/float32/int8, openvino/float32/int8: its layers are "
                                             r".*\); add one that can to eval.profile_backends \(e.g. eager\)"):
        load_or_measure_profile(sliding, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                backends=["onnxruntime", "openvino"], weights=["int8"])
    assert load(tiny).executions  # a full-attention model is untouched


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None, reason="onnxruntime-genai is not installed")
def test_the_default_runs_choice_weighs_w8a8s_where_it_is_lossless_and_openvino_refuses_it(tiny, measuring,
                                                                                             monkeypatch):
    """method=first_look's profile weighs int4 and w8a8s. onnxruntime measures w8a8s where this CPU sums int8 products
    exactly (export.int8_sums_exact) and records why not elsewhere; model.weights=auto then takes w8a8s, its verify
    priced cheaper here, exactly where its row check passed, else int4, and int4 stays the fastest plain decoding.
    openvino refuses w8a8s naming onnxruntime, before building anything. (OpenVINO's int4 route is not built here: a
    process that has built and run it segfaulted when it then forked, as test_training's loader workers do.)"""
    from specbench.evaluation.precision import plan
    from specbench.execution.onnxruntime.export import int8_sums_exact

    def priced(model, sizes, contexts, repeats, statistic):  # w8a8s: a dearer row alone, a cheaper verify
        frame = fake_latency(model, sizes, contexts, repeats, statistic)
        if "-w8a8s" in str(getattr(model.session, "_model_path", "")):
            return frame.assign(ms=frame["ms"] + 2.0 - frame["tokens"])
        return frame.assign(ms=frame["ms"] + frame["tokens"])

    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: measuring.append(a) or priced(*a, **k))
    profile = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                      backends=["onnxruntime"], weights=["int4_g32", "w8a8s"])
    exact = int8_sums_exact() is None
    assert (("onnxruntime", "float32", "w8a8s") in profile.executions) == exact
    assert exact or "int8" in profile.machine["unsupported"]["onnxruntime/float32/w8a8s"]
    chosen = plan("auto", "auto", profile, 4, 16, "auto", ["int4_g32", "w8a8s"])
    takes_w8a8s = exact and profile.lossless(Execution("onnxruntime", "float32", "w8a8s"))
    assert chosen.weights == ("w8a8s" if takes_w8a8s else "int4_g32")
    assert chosen.fastest_plain.weights == "int4_g32"
    with pytest.raises(SpecbenchError, match=r"openvino/float32/w8a8s: w8a8s is built into ONNX Runtime's graph from "
                                             r"calibrated ranges: it runs on model.backend=onnxruntime only"):
        load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                backends=["openvino"], weights=["w8a8s"])


def test_a_longer_run_adds_a_context_and_each_executions_grid_stays_whole(tiny, measuring):
    """A first look measures short contexts at small sizes; a later run needing a longer context (at fewer sizes)
    measures it at every size cached too: a grid missing (n, context) pairs could not be read back."""
    load_or_measure_profile(tiny, dtypes=["float32"], sizes=[1, 4], contexts=[8], repeats=1, backends=["eager"])
    longer = load_or_measure_profile(tiny, dtypes=["float32"], sizes=[1], contexts=[8, 16], repeats=1,
                                     backends=["eager"])
    assert set(zip(longer.latency["tokens"], longer.latency["context"])) == {(1, 8), (4, 8), (1, 16), (4, 16)}
    again = MachineProfile.from_json(profile_path(tiny.name, "cpu").read_text())  # read back whole
    assert again.covers(["float32"], [1, 4], [8, 16])


def test_a_run_measures_the_contexts_up_to_the_first_that_holds_its_own():
    from specbench.evaluation.plan import profile_contexts

    cfg = OmegaConf.create({"eval": {"profile_contexts": [1024, 128, 256], "profile_context": 128,
                                     "max_new_tokens": 32}})
    assert profile_contexts(cfg) == [128, 256]  # a first look reads no L(n) at 1024
    cfg.eval.max_new_tokens = 512
    assert profile_contexts(cfg) == [128, 256, 1024]
    cfg.eval.max_new_tokens = 4096
    assert profile_contexts(cfg) == [128, 256, 1024]  # beyond the largest: extrapolated from it


def test_a_run_that_asks_for_more_executions_measures_only_the_new_ones(tiny, measuring, monkeypatch, capsys):
    """A first run's profile (eager fp32), then a run that also weighs prepacked and int4: only those two are timed,
    the cached curve is kept as it was, and the notice says what was measured and what was cached. A float
    execution twice as slow as a measured float one at both ends is recorded, not measured: it can be neither the
    cheapest verify nor the float weights' fastest plain decoding."""
    first = load(tiny)
    assert len(measuring) == 1
    capsys.readouterr()
    more = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                   backends=["eager", "prepacked"], weights=["fp", "int4_g32"])
    out = capsys.readouterr().out
    assert "3 execution(s): prepacked/float32, eager/float32/int4_g32, prepacked/float32/int4_g32" in out
    assert "1 cached" in out  # prepacked int4 is recorded as unsupported, not timed
    assert len(measuring) == 1 + 2 + 2  # prepacked: a dominance probe and its curve; int4 the same
    eager = more.latency[(more.latency["backend"] == "eager") & (more.latency["weights"] == "fp")]
    pd.testing.assert_frame_equal(eager.reset_index(drop=True), first.latency.reset_index(drop=True), check_dtype=False)
    assert set(more.executions) >= {("eager", "float32", "fp"), ("prepacked", "float32", "fp")}

    def slow_packed(model, sizes, contexts, repeats, statistic):
        from specbench.execution.backends import PackedLinear
        frame = fake_latency(model, sizes, contexts, repeats, statistic)
        return frame.assign(ms=frame["ms"] * 3) if any(isinstance(m, PackedLinear) for m in model.modules()) else frame

    monkeypatch.setenv("SPECBENCH_CACHE", str(cache_root() / "other"))
    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: measuring.append(a) or slow_packed(*a, **k))
    profile = load_or_measure_profile(tiny, dtypes=["float32"], sizes=SIZES, contexts=CONTEXTS, repeats=1,
                                      backends=["eager", "prepacked"])
    assert profile.machine["unsupported"]["prepacked/float32"].startswith("dominated:")
    assert set(profile.executions) == {("eager", "float32", "fp")}


# --- the cache file ----------------------------------------------------------------------------------------------

def test_a_truncated_profile_is_measured_again_with_a_one_line_notice(tiny, measuring, capsys):
    first = load(tiny)
    path = profile_path(tiny.name, "cpu")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # a run killed mid-write, before writes were atomic
    again = load(tiny)
    notice = [line for line in capsys.readouterr().out.splitlines() if line.startswith("notice:")]
    assert len(notice) == 1 and f"the cached machine profile {path} is not valid JSON" in notice[0]
    assert notice[0].endswith("measuring it again") and len(measuring) == 2
    pd.testing.assert_frame_equal(again.latency, first.latency)
    assert MachineProfile.from_json(path.read_text()).latency.equals(first.latency)  # rewritten whole
    load(tiny)
    assert len(measuring) == 2  # and read from the cache after that


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d["latency"][1].update(ms=float("nan")), "holds ms=nan (eager/float32, n=4, context 8)"),
    (lambda d: d["latency"][2].update(ms=-3.5), "holds ms=-3.5 (eager/float32, n=1, context 16)"),
    (lambda d: d["latency"][0].update(ms=0), "holds ms=0.0 (eager/float32, n=1, context 8)"),
    (lambda d: d["latency"][3].update(ms=float("inf")), "holds ms=inf"),
    (lambda d: d["latency"][3].update(ms="fast"), "holds ms='fast'"),
    (lambda d: d["latency"][0].update(context=None), "holds context=nan (eager/float32, n=1, context nan)"),
    (lambda d: d.pop("latency"), "lacks the key 'latency'"),
    (lambda d: d["latency"][0].pop("ms"), "holds ms=nan (eager/float32, n=1, context 8)"),  # the record lacks it
    (lambda d: d["latency"].pop(), "lacks some (n, context) pairs of eager/float32"),
    (lambda d: d.update(latency=[]), "has no latencies"),
    (lambda d: d.update(latency=5), "holds a 'latency' that is not a list of records"),
    (lambda d: d["peaks"].update(mem_bandwidth_gbs=-1.0), "holds peaks.mem_bandwidth_gbs=-1.0: it must be a finite"),
    (lambda d: d["peaks"]["peak_tflops"].update(float32=float("nan")), "holds peaks.peak_tflops={'float32': nan}"),
    (lambda d: d["peaks"].pop("memory_gb"), "lacks the key 'peaks.memory_gb'"),
    (lambda d: d.clear(), "lacks the key 'machine'"),
])
def test_a_profile_with_impossible_numbers_or_missing_keys_is_measured_again(tiny, measuring, capsys, edit, problem):
    load(tiny)
    path = profile_path(tiny.name, "cpu")
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))  # json writes NaN and Infinity, and reads them back
    capsys.readouterr()
    profile = load(tiny)
    out = capsys.readouterr().out
    assert out.count("notice:") == 1 and f"the cached machine profile {path} " in out
    assert problem in out, out
    assert len(measuring) == 2 and (profile.latency["ms"] > 0).all()
    assert MachineProfile.from_json(path.read_text()).latency.equals(profile.latency)


def test_a_json_that_is_not_an_object_is_measured_again(tiny, measuring, capsys):
    path = profile_path(tiny.name, "cpu")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2]")
    load(tiny)
    assert f"notice: the cached machine profile {path} is not a JSON object; measuring it again" in \
        capsys.readouterr().out


def test_peaks_skip_a_bad_cached_file_and_are_measured_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks, "measure_peaks", lambda device: PEAKS)
    path = tmp_path / "profiles" / f"{fingerprint()}-cpu-peaks.json"
    path.parent.mkdir()
    path.write_text('{"peaks": {"peak_tflops": {"float32": 0.2}, "mem_bandw')
    assert measured_peaks("cpu") == PEAKS
    assert f"notice: the cached machine profile {path} is not valid JSON" in capsys.readouterr().out
    assert json.loads(path.read_text())["peaks"] == PEAKS  # rewritten whole
    path.write_text(json.dumps({"peaks": {**PEAKS, "memory_gb": float("nan")}}))
    assert measured_peaks("cpu") == PEAKS
    assert "holds peaks.memory_gb=nan: it must be a finite positive number" in capsys.readouterr().out


def test_a_failed_write_leaves_the_old_file_whole_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    write_atomic(path, '{"old": true}')

    def crash(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, '{"new": true, "long": "' + "x" * 100_000 + '"}')
    assert json.loads(path.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # the temporary file is gone


def test_the_profile_is_written_through_a_temporary_file_in_its_directory(tiny, measuring, monkeypatch):
    moves = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: moves.append((src, dst)) or real(src, dst))
    load(tiny)
    path = profile_path(tiny.name, "cpu")
    assert [(os.path.dirname(src), dst) for src, dst in moves] == [(str(path.parent), path)]


def test_a_profile_made_in_code_with_a_bad_latency_is_one_error_line():
    with pytest.raises(SpecbenchError, match=r"^the machine profile holds ms=-1\.0 \(eager/float32, n=4, context 8\):"
                                             r" latencies, sizes and contexts must be finite positive numbers$"):
        grid_profile({(1, 8): 2.0, (4, 8): -1.0})


# --- L(n, context) -----------------------------------------------------------------------------------------------

def test_below_the_measured_range_the_smallest_measurement_is_used():
    p = grid_profile({(2, 128): 20.0, (8, 128): 80.0, (2, 1024): 30.0, (8, 1024): 90.0})
    assert p.latency_ms("float32", 1, 128) == 20.0  # linear extrapolation would say 10
    assert p.latency_ms("float32", 0.1, 128) == 20.0  # and 1 here
    assert p.latency_ms("float32", 8, 16) == 80.0  # context below 128: the 128 column
    assert p.latency_ms("float32", 1, 0) == 20.0
    assert p.latency_ms("float32", 5, 576) == pytest.approx(55.0)  # inside: bilinear, as before


def test_data_that_would_extrapolate_negative_give_positive_monotone_latencies():
    """Noise made context 1024 cheaper than 128 and n = 2 cheaper than n = 1: extrapolating those slopes went
    negative (L(1, 8192) = 40 - 7168 * 10 / 896 = -40 ms), and a negative latency won every dtype choice."""
    p = grid_profile({(1, 128): 50.0, (2, 128): 48.0, (8, 128): 60.0,
                      (1, 1024): 40.0, (2, 1024): 41.0, (8, 1024): 45.0})
    assert p.latency_ms("float32", 1, 8192) == 50.0  # flat: the cheaper long context is taken for noise
    assert p.latency_ms("float32", 2, 128) == 50.0  # a bigger tree costs no less than a smaller one
    ns, cs = np.array([0.5, 1, 1.5, 2, 3, 8, 9, 16, 64, 500]), np.array([1, 128, 300, 1024, 2000, 8192, 1e6])
    table = np.array([[p.latency_ms("float32", n, c) for c in cs] for n in ns])
    assert (table > 0).all() and np.isfinite(table).all()
    assert (np.diff(table, axis=0) >= 0).all() and (np.diff(table, axis=1) >= 0).all()


@pytest.mark.parametrize("seed", range(20))
def test_latency_is_positive_and_monotone_for_any_measured_grid(seed):
    """Random positive tables (noise in every direction): the surface is monotone in n and in context everywhere,
    beyond both ranges at once included, and equals the measurement at every point the table already orders."""
    rng = np.random.default_rng(seed)
    sizes, contexts = [1, 2, 4, 8], [64, 256, 1024]
    ms = {(n, c): float(rng.uniform(0.5, 100)) for n in sizes for c in contexts}
    p = grid_profile(ms)
    ns = np.array([0.1, 1, 1.5, 2, 3, 4, 6, 8, 9, 32, 1000])
    cs = np.array([0, 64, 100, 256, 700, 1024, 1500, 4096, 1e5])
    table = np.array([[p.latency_ms("float32", n, c) for c in cs] for n in ns])
    assert (table > 0).all() and np.isfinite(table).all()
    assert (np.diff(table, axis=0) >= -1e-9).all() and (np.diff(table, axis=1) >= -1e-9).all()
    for (n, c), v in ms.items():  # never below the measurement itself
        assert p.latency_ms("float32", n, c) >= v


def test_monotone_measurements_are_read_as_before():
    """A well-behaved profile (linear in n and context) reads exactly as the old interpolation did, extrapolated
    linearly above the range in both."""
    p = grid_profile({(n, c): 50 + 2 * n + c / 100 for n in (1, 8, 32) for c in (128, 1024)})
    for n, c in [(4, 128), (8, 576), (64, 2048), (100, 500), (16, 4096)]:
        assert p.latency_ms("float32", n, c) == pytest.approx(50 + 2 * n + c / 100)
    assert math.isclose(p.latency_ms("float32", 1, 128), 53.28)


def test_a_profile_is_named_by_declared_versions_so_a_comment_leaves_it_valid(tmp_path, monkeypatch):
    """The cache name holds the measuring key: MEASURING_VERSION and the measured libraries' versions. Editing a
    measured module's comments (its source bytes) leaves a machine's cached profile valid; bumping the version or
    another library version names another file, measured anew."""
    from specbench.execution import backends

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    before = profile_path("m", "cpu")
    edited = tmp_path / "backends.py"
    edited.write_text(open(backends.__file__).read() + "\n# a comment\n")
    monkeypatch.setattr(backends, "__file__", str(edited))
    assert profile_path("m", "cpu") == before
    monkeypatch.setattr(cache, "MEASURING_VERSION", cache.MEASURING_VERSION + 1)
    bumped = profile_path("m", "cpu")
    assert bumped != before
    real = cache.metadata.version
    monkeypatch.setattr(cache.metadata, "version", lambda name: "0.0" if name == "torch" else real(name))
    assert profile_path("m", "cpu") not in (before, bumped)


def test_peaks_are_read_from_a_cached_model_profile_whatever_code_measured_it(tmp_path, monkeypatch):
    """Peaks are the machine's: a model's cached profile (named with a code digest) serves them without measuring."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks, "measure_peaks", lambda device: pytest.fail("measured again"))
    path = profile_path("m", "cpu").with_name(f"{fingerprint()}-0123456789-cpu-m.json")  # another code version
    path.parent.mkdir()
    path.write_text(json.dumps({"peaks": PEAKS}))
    assert measured_peaks("cpu") == PEAKS
