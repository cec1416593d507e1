"""The onnxruntime backend: the builder's graph of the tiny target run with every attention at least two rows (the
whole call where the machine's kernels give a lone row other bits), a draft tree cut to its first path where int8
activations make a tree's rows differ, and its settings refused in one line before any model loads. Whether this
CPU's kernels keep a chain's rows bitwise is measured by the machine's row check, never asserted: where they do not,
the lossless test says so and skips."""

import collections
import importlib.util
import json

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.errors import SpecbenchError
from specbench.execution.onnxruntime import forward as forward_module
from specbench.hardware.measured.row_invariance import BITWISE, check_rows
from specbench.sampling import SamplingParams
from specbench.trees.native import NativePolicy
from specbench.trees.token_tree import TokenTree

NO_ONNXRUNTIME = any(importlib.util.find_spec(m) is None for m in ("onnxruntime", "onnxruntime_genai", "onnx_ir"))
needs_onnxruntime = pytest.mark.skipif(NO_ONNXRUNTIME, reason="onnxruntime-genai is not installed")


def test_a_trees_first_path_follows_each_nodes_first_child_with_its_draft_probabilities():
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13, 15]), torch.tensor([-1, 0, 0, 2, 1, 4]),
                     torch.arange(6.0)[:, None].expand(6, 3))
    chain = tree.first_path()  # 5 -> 7 (the root's first child) -> 13 -> 15
    assert chain.tokens.tolist() == [5, 7, 13, 15] and chain.is_chain
    assert chain.draft_probs[:, 0].tolist() == [0.0, 1.0, 4.0, 5.0]
    assert TokenTree.chain(3, []).first_path().tokens.tolist() == [3]


@needs_onnxruntime
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int4_g32", "w8a8", "w8a8s"])
def test_an_int8_activation_route_decodes_chains_as_its_plain_decoding_where_this_cpu_keeps_their_rows(
        weights, tiny, tmp_path, monkeypatch):
    """int4_g32, w8a8 and w8a8s (int8 activations): a one-row call pads its attention, and its other layers only where a
    lone row keeps its bits there; trees are cut to their first path; and where the machine's row check finds the
    chains' rows bitwise, greedy speculation returns the route's plain decoding (prompts split as measured and, where
    the route has a prefill graph, every prompt by it)."""
    from specbench.execution.onnxruntime.export import PREFILL_GRAPH, export, int8_sums_exact
    from specbench.execution.value import Execution

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    if weights.startswith("w8a8") and (why := int8_sums_exact()) is not None:
        pytest.skip(why)
    run = Execution("onnxruntime", "float32", weights).apply(tiny)
    model = run.model
    assert model.chains_only and model.padded_rows(5) == 5
    assert model.padded_rows(1) == (1 if model.attention_pad else 2)
    with torch.inference_mode():  # the forward's choice is what a lone row gives here, measured again
        kept = model.attention_pad
        model.attention_pad = True
        ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :4], past_key_values=cache)
        alone = model(input_ids=ids[:, 4:5], past_key_values=cache).logits[0, 0]
        cache.crop(-1)
        assert torch.equal(alone, model(input_ids=ids[:, 4:], past_key_values=cache).logits[0, 0]) or not kept
        model.attention_pad = kept
    with torch.inference_mode():
        rows = check_rows(model, torch.float32, tiny.model.config.vocab_size)
    if rows.verdict != BITWISE:
        pytest.skip(f"this CPU's int8 kernels do not keep a chain's rows: {rows.describe()}")
    ran = collections.Counter()  # calls by graph: the prefill graph's binding or the verify graph's
    run_binding = forward_module.SessionBinding.run
    monkeypatch.setattr(forward_module.SessionBinding, "run",
                        lambda self, logits: ran.update([self.session is not model.session]) or run_binding(self, logits))
    accepted = 0
    has_prefill = (export(tiny, weights) / PREFILL_GRAPH).exists()  # w8a8(s) has none: one kernel for all rows
    for prefill_rows in (model.prefill_rows, 1 if has_prefill else None):  # as measured here, then all by prefill.onnx
        model.prefill_rows = prefill_rows
        for text in ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]:
            prompt = tiny.tokenizer(text)["input_ids"]
            plain, pld = (Decoder(model, drafter, ExactAcceptance(), SamplingParams(), 32, tiny.eos_token_ids,
                                  max_context=tiny.max_context).generate(prompt)
                          for drafter in (PlainDrafter(), PromptLookupDrafter(run, NativePolicy(8))))
            assert pld.tokens == plain.tokens
            assert all(s.tree_size == s.tree_depth + 1 for s in pld.steps)  # every verify a chain
            accepted += sum(s.accepted for s in pld.steps)
    assert accepted > 0 and (ran[True] >= 6 or not has_prefill)  # six prompts' prefills ran the prefill graph
    before = torch.get_num_threads()
    Decoder(model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 4, tiny.eos_token_ids).generate([5, 6, 7])
    assert torch.get_num_threads() == before  # one torch thread inside the decode, the process's own after


@needs_onnxruntime
@pytest.mark.parametrize("override, message", [
    ("eval.dtype=bfloat16", "model.backend=onnxruntime with eval.dtype=bfloat16: it runs float32 activations"),
    ("model.weights=w4a8", "model.weights=w4a8 with model.backend=onnxruntime: w4a8 is OpenVINO's dynamic "
                           "quantisation of activations"),
    ("model.weights=int4 model.group_size=48", "^model.group_size=48 is invalid for int4 weights on "
                                               "model.backend=onnxruntime: give one of 16, 32, 64, 128, 256"),
    ("eval.batch_size=2", "model.backend=onnxruntime with eval.batch_size=2: it decodes one prompt at a time"),
])
def test_onnxruntime_settings_it_cannot_run_are_one_line_before_the_model_loads(override, message, tmp_path,
                                                                                monkeypatch):
    from specbench.tasks import dispatch
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    monkeypatch.setattr(eval_task, "setup_target", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = compose_cfg(["model=tiny_random", "model.backend=onnxruntime", "eval.dtype=float32", *override.split()],
                      tmp_path / "run")
    with pytest.raises(SpecbenchError, match=message):
        dispatch(cfg)


def test_a_method_reading_hidden_states_or_adding_embedding_rows_is_one_line_on_onnxruntime():
    from types import SimpleNamespace

    from specbench.evaluation.plan import check_token_only

    class Heads(PlainDrafter):
        needs_hidden_states = True

    class Extras(PlainDrafter):
        def verify_extras(self, tree):
            return None

    entry = SimpleNamespace(label="mine", name="medusa")
    check_token_only([entry, entry], [PlainDrafter(), PlainDrafter()])
    for drafter in (Heads(), Extras()):
        with pytest.raises(SpecbenchError, match=r"^methods entry 'mine' \(method=medusa\) reads the target's hidden "
                                                 r"states or feeds it embeddings.*model.backend=openvino"):
            check_token_only([entry], [drafter])


@needs_onnxruntime
@pytest.mark.slow
def test_a_route_in_int4_groups_the_eager_kernels_cannot_hold_runs_with_its_engine_beside_it(tiny, tmp_path,
                                                                                              monkeypatch):
    """The builder pads a block of 128 over the tiny model's 64 channels, which the eager int4 kernel refuses: the
    engines' eager target is made only for an engine that decodes it, so the route and ONNX Runtime GenAI (which builds
    from the float weights) run, in those groups, where the run used to stop on the eager kernel's group check; and the
    model they run holds those groups (the builder once ignored the key it was asked by, and wrote its default 32)."""
    import onnx

    from specbench.execution.onnxruntime.export import export
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    cfg = compose_cfg(["model=tiny_random", "model.backend=onnxruntime", "model.weights=int4", "model.group_size=128",
                       "eval.dtype=float32", "eval.num_prompts=1", "eval.max_new_tokens=8", "eval.warmup=0",
                       "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false",
                       "eval.engines=[onnxruntime]", "eval.engine_options.onnxruntime.weights=int4_g128"],
                      tmp_path / "run")
    summary = eval_task.run(cfg)
    assert {"plain", "onnxruntime"} <= set(summary["method"])
    engine = summary.set_index("method").loc["onnxruntime"]
    assert engine["weights"] == "int4_g128" and engine["tokens_per_s"] > 0
    graph = onnx.load(str(export(tiny, "int4_g128") / "model.onnx"), load_external_data=False).graph
    assert {a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "block_size"} \
        == {128}


def test_a_builder_graph_in_other_groups_than_asked_is_refused_in_one_line(tmp_path):
    from onnx import TensorProto, helper, save

    from specbench.execution.onnxruntime.export import BuildFailed, check_group

    node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=64, N=8, bits=4,
                            block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    check_group(tmp_path / "model.onnx", 32)
    with pytest.raises(BuildFailed, match=r"^the builder wrote int4 products in blocks of \[32\], not the 64 asked"):
        check_group(tmp_path / "model.onnx", 64)


def test_the_prefill_graph_is_the_verify_graph_on_float_activations_and_only_where_they_were_int8(tmp_path):
    from onnx import TensorProto, helper, load, save

    from specbench.execution.onnxruntime.export import float_prefill

    def graph(level: int):
        node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=64, N=8, bits=4,
                                block_size=32, accuracy_level=level)
        return helper.make_model(helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]))

    save(graph(4), str(tmp_path / "int8.onnx"))
    float_prefill(tmp_path / "int8.onnx", tmp_path / "int8_prefill.onnx")
    written = load(str(tmp_path / "int8_prefill.onnx")).graph.node
    assert [a.i for n in written for a in n.attribute if a.name == "accuracy_level"] == [1]
    save(graph(1), str(tmp_path / "float.onnx"))
    float_prefill(tmp_path / "float.onnx", tmp_path / "float_prefill.onnx")
    assert not (tmp_path / "float_prefill.onnx").exists()  # nothing to gain: no second session


@needs_onnxruntime
@pytest.mark.slow
def test_where_the_prefill_graph_starts_is_measured_once_per_machine_and_thread_count_and_then_read(tiny, tmp_path,
                                                                                                   monkeypatch, capsys):
    """The route's folder keeps the rows from which a prompt runs the prefill graph, per thread count: a second
    forward on it reads them (here edited to 7) instead of timing the graphs again, so every run on this machine
    prefills a prompt by the same graph; a record holding no row count says so in one line and is measured again."""
    from specbench.execution.onnxruntime.export import PREFILL_GRAPH, export
    from specbench.execution.onnxruntime.forward import OnnxRuntimeForward

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = export(tiny, "int4_g32")
    record = (folder / PREFILL_GRAPH).with_suffix(".json")
    paths = (str(folder / "verify.onnx"), 2, True, str(folder / PREFILL_GRAPH))
    first = OnnxRuntimeForward(tiny.model, *paths[:3], prefill_path=paths[3])
    kept = json.loads(record.read_text())["threads=2"]
    assert first.prefill_rows == kept["rows"] and set(kept["ms_verify_vs_prefill"]) == {"16", "32", "64", "128", "256"}
    record.write_text(json.dumps({"threads=2": {"rows": 7, "ms_verify_vs_prefill": {}}}))
    assert OnnxRuntimeForward(tiny.model, *paths[:3], prefill_path=paths[3]).prefill_rows == 7
    record.write_text(json.dumps({"threads=2": {"rows": "many"}}))  # a hand-edited record is not trusted
    again = OnnxRuntimeForward(tiny.model, *paths[:3], prefill_path=paths[3])
    assert "rows='many' for threads=2, not a row count >= 1 or null; measuring again" in capsys.readouterr().out
    assert again.prefill_rows == json.loads(record.read_text())["threads=2"]["rows"] != "many"
    assert OnnxRuntimeForward(tiny.model, *paths[:3]).prefill_rows is None  # no prefill graph: every call verifies


@needs_onnxruntime
def test_w8a8_products_quantise_each_row_alone_and_sum_its_codes_exactly(tmp_path):
    """export.w8a8_products on a one-product float graph: its output is W8A8Linear's arithmetic (int8 codes per row
    and per output channel, exact integer sums, both scales applied after), and a row's output does not depend on the
    other rows of its call, bit for bit, whatever their scale."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from specbench.execution.onnxruntime.export import int8_sums_exact, w8a8_products

    if (why := int8_sums_exact()) is not None:
        pytest.skip(why)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 80)).astype(np.float32)
    path = one_product(tmp_path, w)
    w8a8_products(path)
    assert {n.op_type for n in onnx.load(str(path)).graph.node} >= {"QuantizeLinear", "MatMulIntegerToFloat"}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = (rng.standard_normal((1, 7, 96)) * np.array([1, 100, 0.01, 5, 1, 30, 2])[None, :, None]).astype(np.float32)
    x[0, 3, 10] = 400.0  # an outlier: its row's scale alone grows
    out = session.run(None, {"x": x})[0]
    w_scale = np.abs(w).max(axis=0) / 127
    w_codes = np.clip(np.round(w / w_scale), -127, 127)
    x_scale = np.abs(x).max(axis=-1, keepdims=True) / 127
    x_codes = np.clip(np.round(x / x_scale), -127, 127)
    reference = (x_codes @ w_codes) * x_scale * w_scale  # integer sums below 2**24: exact in float64
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=0)
    for start, rows in ((0, 1), (3, 1), (2, 3), (5, 2)):
        part = session.run(None, {"x": np.ascontiguousarray(x[:, start:start + rows])})[0]
        assert np.array_equal(part, out[:, start:start + rows])


@needs_onnxruntime
def test_w8a8s_products_quantise_by_calibrated_smoothed_constants(tmp_path):
    """export.w8a8_products with calibrated ranges (w8a8s) on a one-product float graph: each channel divided by its
    SmoothQuant smoothing and quantised by one scale for all, the weights' rows multiplied by the smoothing first; its
    output is that arithmetic, a value past the calibrated range saturates, and a row's output is the same bit for bit
    in any call."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from specbench.execution.onnxruntime.export import SMOOTHING, int8_sums_exact, w8a8_products

    if (why := int8_sums_exact()) is not None:
        pytest.skip(why)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 80)).astype(np.float32)
    seen = np.abs(rng.standard_normal(96)).astype(np.float32) + 0.1
    seen[7] = 50.0  # an outlier channel: smoothing moves it into the weights' row 7
    path = one_product(tmp_path, w)
    w8a8_products(path, {"w": seen})
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["Mul", "QuantizeLinear", "MatMulIntegerToFloat"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = (rng.standard_normal((1, 6, 96)) * seen / 3).astype(np.float32)
    x[0, 2, 7] = 500.0  # ten times its calibrated range: saturates
    out = session.run(None, {"x": x})[0]
    smoothing = (seen ** SMOOTHING / np.abs(w).max(axis=1) ** (1 - SMOOTHING)).astype(np.float32)
    scale = np.float32((seen / smoothing).max() / 127)
    x_codes = np.clip(np.round(x * (1 / (smoothing * scale)).astype(np.float32)), -128, 127)
    smoothed = w * smoothing[:, None]
    w_scale = np.abs(smoothed).max(axis=0) / 127
    w_codes = np.clip(np.round(smoothed / w_scale), -127, 127)
    reference = (x_codes @ w_codes) * scale * w_scale
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6)
    assert x_codes[0, 2, 7] == 127  # the saturated value's code
    np.testing.assert_allclose(out[0, [0, 1, 3]], (x[0, [0, 1, 3]] @ w), rtol=0.05, atol=0.5)  # near the float product
    for start, rows in ((0, 1), (2, 1), (1, 3), (4, 2)):
        part = session.run(None, {"x": np.ascontiguousarray(x[:, start:start + rows])})[0]
        assert np.array_equal(part, out[:, start:start + rows])


@needs_onnxruntime
def test_activation_ranges_are_each_products_input_maxima_and_the_same_on_every_build(tiny, tmp_path, monkeypatch):
    """export.activation_ranges on the tiny model's float graph: a range for every product by a constant weight, as
    wide as its input, never negative and not all zero, the same for the products that read one activation, and the
    same again on a second call (the text it samples is seeded), so a w8a8s folder built again is the same model."""
    import numpy as np
    import onnx

    from specbench.execution.onnxruntime.export import activation_ranges, bos_token, export

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = export(tiny, "fp32")
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    widths = {i.name: i.dims[0] for i in graph.initializer if len(i.dims) == 2}
    products = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in widths]
    ranges = activation_ranges(folder, bos_token(tiny), 64)
    assert sorted(ranges) == sorted(n.input[1] for n in products)
    for node in products:
        seen = ranges[node.input[1]]
        assert seen.shape == (widths[node.input[1]],) and (seen >= 0).all() and seen.max() > 0
    readers = collections.defaultdict(list)
    for node in products:
        readers[node.input[0]].append(ranges[node.input[1]])
    assert any(len(r) > 1 for r in readers.values())  # projections that read one activation (q, k, v or gate, up)
    assert all(np.array_equal(r[0], other) for r in readers.values() for other in r[1:])
    again = activation_ranges(folder, bos_token(tiny), 64)
    assert all(np.array_equal(ranges[w], again[w]) for w in ranges)


@needs_onnxruntime
def test_w8a8_is_refused_in_one_line_where_this_cpus_int8_sums_are_not_exact(tmp_path, monkeypatch):
    """Where the machine's int8 kernel saturates its pairs of products (MLAS without VNNI), w8a8's graph is not built
    and a run naming it stops in one line before any model loads."""
    import importlib

    import numpy as np

    from specbench.execution.onnxruntime import route
    from specbench.tasks import dispatch
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    export_module = importlib.import_module("specbench.execution.onnxruntime.export")  # the package names a function so
    why = "this CPU's int8 kernel does not sum uint8 x int8 products exactly"
    monkeypatch.setattr(export_module, "int8_sums_exact", lambda: why)
    monkeypatch.setattr(route, "int8_sums_exact", lambda: why)
    with pytest.raises(export_module.BuildFailed, match=why):
        export_module.w8a8_products(one_product(tmp_path, np.ones((8, 4), np.float32)))
    monkeypatch.setattr(eval_task, "setup_target", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = compose_cfg(["model=tiny_random", "model.backend=onnxruntime", "model.weights=w8a8", "eval.dtype=float32"],
                      tmp_path / "run")
    with pytest.raises(SpecbenchError, match=f"^model.backend=onnxruntime with model.weights=w8a8: {why}"):
        dispatch(cfg)


def one_product(folder, w):
    """A float graph of one product x @ w (x: [1, rows, in]), saved in `folder` as model.onnx."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one_product",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "rows", w.shape[1]])],
                              [numpy_helper.from_array(w, "w")])
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]), str(path))
    return path
