"""The target built for ONNX Runtime by ONNX Runtime GenAI's own model builder (onnxruntime_genai.models.builder), once
per machine: the generator's model (`model.onnx`, what the engine decodes with) and the same graph with more inputs
for a verify (`verify.onnx`): `position_ids`, a tree node's position, and `attention_bias`, the additive mask that
keeps a node from its non-ancestors, both read by the builder's GroupQueryAttention nodes, which take them as optional
inputs; `attention_rows` and `attention_kept`, the call's rows each attention node runs (a pad row repeats the last)
and those it hands on, so a one-row call can pad its attention alone (forward.py says why); and `logits_rows`, the
rows the LM head projects (a prompt's last ones, not all of them); and, where its products take int8 activations,
`prefill.onnx`, the verify graph with every int4 or int8 product on float activations, which a long prompt may run
faster (forward.py measures from how many rows). The files share one weights file, but for `w8a8` and `w8a8s`
(w8a8_products), where each graph has its own.

On a CPU the builder's int4 and int8 models multiply by int8 activations (MatMulNBits at accuracy level 4) and attend
with GroupQueryAttention over a cache held in place. Cached under cache_root()/onnxruntime, keyed by the model's
source, the weight format and the versions that shape it, and written whole (a temporary folder, renamed).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

from specbench.errors import SpecbenchError
from specbench.execution.int8_grid import per_channel_int8
from specbench.execution.openvino import interrupt_after, quiet_transformers, save_whole, usable
from specbench.execution.openvino.export import model_key
from specbench.models.loading import LoadedModel, cache_root, with_dtype

INT4_GROUPS = (16, 32, 64, 128, 256)  # the block sizes MatMulNBits takes
WHAT = "ONNX Runtime GenAI model"
# what add_verify_inputs writes and how the builder is asked for the weights (v4: the group by its own key; v5: the
# prefill graph beside it; v6: w8a8s calibrated on text its own session samples); part of the cache key, so a changed
# layout is built again
LAYOUT = "verify_v6"
PREFILL_GRAPH = "prefill.onnx"
FLOAT_ACTIVATIONS = 1  # MatMulNBits' accuracy_level for float32 activations (4 multiplies by int8 ones)
W8A8 = "w8a8"  # not the builder's: its float graph with every product int8 by int8 (w8a8_products)
W8A8S = "w8a8s"  # w8a8 with each activation's scales fixed at build time (activation_ranges): this backend's own
OWN_FORMATS = (W8A8S,)  # the formats no other backend runs
FLOAT_GRAPH = (W8A8, W8A8S)  # the formats w8a8_products writes from the builder's float graph
# SmoothQuant's migration strength alpha (Xiao et al., 2023): w8a8s divides each input channel by
# max|x|^alpha / max|w|^(1 - alpha) before quantising it, and multiplies the weights' rows by the same. On SmolLM2, 0.8
# kept perplexity nearest the float model's (experiments/onnxruntime_verify, section "w8a8s")
SMOOTHING = 0.8
CALIBRATION = (32, 256)  # the sequences and tokens of text the model samples for activation_ranges


class BuildFailed(Exception):
    """The builder cannot build this model (an architecture it does not know): the caller says so in one line."""


def check_format(weights: str, key: str) -> None:
    """One error line for weights no folder here is built in: fp32, int8, w8a8, w8a8s or int4_g<group> (group 16 to
    256)."""
    head, _, group = str(weights).partition("_g")
    if head in ("fp32", "int8", *FLOAT_GRAPH) and not group:
        return
    if head == "int4" and group.isdigit() and int(group) in INT4_GROUPS:
        return
    raise SpecbenchError(f"{key}={weights!r} is invalid: give fp32, int8, w8a8, w8a8s or int4_g<group> with a group of "
                         f"{', '.join(map(str, INT4_GROUPS))} (e.g. int4_g32)")


def model_folder(loaded: LoadedModel, weights: str) -> Path:
    """Where the builder's model of `loaded` in `weights` is cached: keyed by the model's source and config, two of
    its weights, and the onnxruntime-genai and transformers versions."""
    import onnxruntime_genai as og
    import transformers

    key = model_key(loaded, f"{og.__version__}:{transformers.__version__}:{LAYOUT}")
    return cache_root() / "onnxruntime" / f"{loaded.name}-{key}-{weights}"


def export(loaded: LoadedModel, weights: str) -> Path:
    """The folder of `loaded`'s model (its float weights) in `weights`: model.onnx, verify.onnx, their weights, the
    tokenizer and genai_config.json; cached, built once (and again when the cached one is unusable)."""
    folder = model_folder(loaded, weights)
    if usable(folder, WHAT):
        return folder
    print(f"notice: building {loaded.name} for ONNX Runtime ({weights}) once, into {folder}")
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    fp32 = with_dtype(loaded, "float32")
    head, _, group = weights.partition("_g")
    head = "fp32" if weights in FLOAT_GRAPH else head  # w8a8_products quantises the float graph

    def save(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            source = Path(scratch) / "model"
            fp32.model.save_pretrained(source)
            fp32.tokenizer.save_pretrained(source)
            where = (str(source), str(tmp), head, "cpu", str(Path(scratch) / "cache"))
            # `block_size` is the builder's key (QuantConfig.from_extra_options); an unknown one is ignored silently,
            # so the built graph's group is checked below
            options = [f"block_size={group}"] if group else []
            # the builder prints a progress line per tensor and its quantiser logs one per layer; a failure raises
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    quiet_transformers(), _quiet("onnxruntime"), interrupt_after("the model builder"):
                create_model(None, *where, **parse_extra_options(None, *where, options))
        if group:
            check_group(tmp / "model.onnx", int(group))
        add_verify_inputs(tmp / "model.onnx", tmp / "verify.onnx")
        if weights in FLOAT_GRAPH:  # the verify graph first: it reads the float weights from model.onnx's file
            ranges = (activation_ranges(tmp, bos_token(loaded), min(CALIBRATION[1], loaded.max_context))
                      if weights == W8A8S else None)
            for graph in ("verify.onnx", "model.onnx"):
                w8a8_products(tmp / graph, ranges)
        float_prefill(tmp / "verify.onnx", tmp / PREFILL_GRAPH)

    try:
        save_whole(folder, save)
    except (ValueError, NotImplementedError, KeyError) as exc:
        why = re.sub(r"\s+", " ", str(exc))[:200]
        raise BuildFailed(f"the ONNX Runtime GenAI builder cannot build {loaded.name}: {why}") from None
    return folder


def check_group(path: Path, group: int) -> None:
    """That every int4 product of the builder's graph at `path` quantises in blocks of `group`: a builder that took
    another group would otherwise hand a model named by the one asked for."""
    import onnx

    nodes = [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "MatMulNBits"]
    built = sorted({a.i for n in nodes for a in n.attribute if a.name == "block_size"})
    if not nodes or built != [group]:
        raise BuildFailed(f"the builder wrote int4 products in blocks of {built or 'nothing'}, not the {group} asked "
                          f"for (onnxruntime-genai's `block_size` option)")


@functools.cache
def int8_sums_exact() -> str | None:
    """None where this machine's MLAS sums w8a8's uint8 x int8 products exactly, else why not (one line). Without
    VNNI, MLAS's u8s8 kernels add each pair of products in 16 bits, saturating (vpmaddubsw), so a product's sums would
    not be W8A8Linear's; measured on the pairs that overflow 16 bits first (255 x 127), at one row and at four, by the
    op the graph runs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    depth = 64
    graph = helper.make_graph(
        [helper.make_node("MatMulIntegerToFloat", ["codes", "weight", "one", "one", "zero"], ["sums"],
                          domain="com.microsoft")], "pairs",
        [helper.make_tensor_value_info("codes", TensorProto.UINT8, ["rows", depth])],
        [helper.make_tensor_value_info("sums", TensorProto.FLOAT, ["rows", 1])],
        [numpy_helper.from_array(np.full((depth, 1), 127, np.int8), "weight"),
         numpy_helper.from_array(np.float32(1), "one"), numpy_helper.from_array(np.uint8(128), "zero")])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=opsets).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    exact = (255 - 128) * 127 * depth  # below 2**24: exact in float32
    for rows in (1, 4):
        got = session.run(None, {"codes": np.full((rows, depth), 255, np.uint8)})[0]
        if not (got == exact).all():
            return (f"this CPU's int8 kernel does not sum uint8 x int8 products exactly ({float(got.flat[0]):,.0f} "
                    f"where {exact:,} is exact, {rows} row(s): its pairs saturate in 16 bits without VNNI), so w8a8's "
                    f"products would not be W8A8Linear's; use int4 weights")
    return None


def bos_token(loaded: LoadedModel) -> int:
    """The token activation_ranges starts the model's text from: its BOS token (else its EOS, else 0)."""
    tokenizer = loaded.tokenizer
    for token in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token is not None:
            return int(token)
    return 0


def activation_ranges(folder: Path, bos: int, tokens: int) -> dict[str, np.ndarray]:
    """For each product by a constant weight of the float graph folder/model.onnx (by its weight's name), the largest
    |x| each of its input channels meets over text that the model samples from its own distribution: CALIBRATION's
    sequences of `tokens` tokens from `bos`, the full vocabulary at temperature 1, no end token, a fixed seed.

    Why sampled and not a dataset's text: the scales then depend on the model alone (the execution layer reads no
    data, and a benchmark's prompts are never its calibration). On SmolLM2 they kept perplexity near that of
    ShareGPT's text (experiments/onnxruntime_verify, section "w8a8s"). Why by hand and not ONNX Runtime's
    MinMaxCalibrater: its per-channel ranges keep axis 1 (a convolution's channels), which for these [batch, tokens,
    channels] activations is the tokens, and it watches every float tensor rather than the products' inputs. Why not
    ONNX Runtime GenAI's sampler: over the full vocabulary it was most of a w8a8s build's time, and it takes one
    append_tokens a generator at a batch above one, so its logits cannot be sampled outside it
    (experiments/onnxruntime_verify, section "w8a8s"); here one session samples and watches the products' inputs in
    the same calls."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    sequences = CALIBRATION[0]
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    products = {n.input[1]: n.input[0] for n in _weight_products(graph.graph)}
    watched = sorted(set(products.values()))
    graph.graph.output.extend(helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in watched)
    probe = folder / "ranges.onnx"  # beside model.onnx, so its external data resolves; removed below
    onnx.save(graph, str(probe))
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
    finally:
        probe.unlink()
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    decoder, ends = config["decoder"], np.atleast_1d(config.get("eos_token_id", []))
    past = {i.name: np.zeros((sequences, decoder["num_key_value_heads"], 0, decoder["head_size"]), np.float32)
            for i in session.get_inputs() if i.name.startswith("past_key_values")}
    presents = [name.replace("past_key_values", "present") for name in past]
    ids, rng = np.full((sequences, 1), bos, np.int64), np.random.default_rng(0)
    largest: dict[str, np.ndarray] = {}
    for step in range(tokens):
        logits, *out = session.run(["logits", *presents, *watched],
                                   {"input_ids": ids, "attention_mask": np.ones((sequences, step + 1), np.int64),
                                    **past})
        past = dict(zip(past, out[:len(presents)]))
        for x, value in zip(watched, out[len(presents):]):
            seen = np.abs(value).reshape(-1, value.shape[-1]).max(0)
            largest[x] = np.maximum(largest[x], seen) if x in largest else seen
        logits = logits[:, -1].astype(np.float64)
        logits[:, ends] = -np.inf  # no end token: every sequence runs its `tokens` tokens
        cumulative = np.cumsum(np.exp(logits - logits.max(1, keepdims=True)), 1)
        # inverse CDF by hand: numpy's Generator.choice draws from one distribution a call, and these are 32 a step
        ids = (cumulative < rng.random((sequences, 1)) * cumulative[:, -1:]).sum(1, keepdims=True)
    # keyed by the product's weight: verify.onnx feeds the LM head through another tensor (logits_rows' Gather)
    return {weight: largest[x] for weight, x in products.items()}


def _weight_products(graph) -> list:
    """The graph's products by a constant weight (MatMul by a 2-D initializer): what w8a8_products quantises."""
    weights = {i.name: i for i in graph.initializer}
    return [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights
            and len(weights[n.input[1]].dims) == 2]


def w8a8_products(path: Path, ranges: dict[str, np.ndarray] | None = None) -> None:
    """The float graph at `path` rewritten in place with every product by a constant weight (each layer's and the LM
    head's) on int8 weights, one scale per output channel (int8_grid), and int8 activations, their products summed
    exactly in int32 and scaled back. Each activation is quantised once for all the products that read it:

    - w8a8 (`ranges` None), as execution/quantize.W8A8Linear computes it: each row on its own when it arrives
      (max |x| -> 127), so each row's output depends on that row alone whatever the kernel's blocking (W8A8Linear says
      why), at the price of some small nodes a row: a max, a scale, and a multiply by it after each product.
    - w8a8s (`ranges`, activation_ranges'): by constants, one per input channel. SmoothQuant's smoothing s =
      max|x|^SMOOTHING / max|w|^(1 - SMOOTHING) moves the channels' outliers into the weights (whose rows are
      multiplied by s before they are quantised), and the channels divided by s share one scale (their largest
      calibrated value -> 127). An activation is a Mul by its channels' reciprocal scales and a QuantizeLinear, a
      product one node: a row's codes are its own by construction, and a value past the calibrated range saturates.

    MatMulIntegerToFloat runs MLAS's QGEMM, which packs the weights once and runs a verify's few rows for little more
    than one, where MatMulNBits' int8-activation kernel pays nearly a one-row product again for each
    (experiments/onnxruntime_verify, sections "w8a8" and "w8a8s").

    Why by hand: neither ONNX Runtime's quantiser nor a contrib op quantises activations per row (DynamicQuantizeLinear
    and DynamicQuantizeMatMul take one scale for the whole call, which makes a row's codes depend on the other rows),
    and its static quantiser calibrates and smooths through a data reader over the whole graph, the attention
    included. MLAS's fast kernels take uint8 activations by int8 weights (int8 by int8 falls to a slow one), so the
    codes are shifted by a zero point of 128: the same integer sums as int8 codes."""
    import onnx
    from onnx import numpy_helper

    if (why := int8_sums_exact()) is not None:
        raise BuildFailed(why)
    model = onnx.load(str(path))
    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    products = _weight_products(graph)
    if not products:
        raise BuildFailed(f"the builder's float graph {path} has no product by a constant weight to quantise")
    readers: dict[str, list[str]] = {}  # an activation -> the weights of the products that read it
    for node in products:
        readers.setdefault(node.input[0], []).append(node.input[1])
    graph.initializer.extend([numpy_helper.from_array(np.uint8(128), "specbench/w8a8/128"),
                              numpy_helper.from_array(np.float32(1), "specbench/w8a8/1")])
    if ranges is None:  # what _per_row's nodes read
        graph.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), "specbench/w8a8/last_axis"),
                                  numpy_helper.from_array(np.float32(127), "specbench/w8a8/127")])
    quantise = {id(n) for n in products}
    quantised: dict[str, _Codes] = {}  # an activation -> its codes, once for its products
    zeros: list[str] = []  # w8a8's per-row zero points: every layer's products run the call's rows
    new: list = []
    for node in graph.node:
        if id(node) not in quantise:
            new.append(node)
            continue
        x, name = node.input[0], node.input[1]
        if x not in quantised:
            p = f"specbench/w8a8/{len(quantised)}"
            if ranges is None:
                lm_head = node is products[-1]  # the LM head may project fewer rows (the verify's logits_rows)
                quantised[x], nodes = _per_row(x, p, zeros, lm_head, weights[name].dims[0])
            else:
                matrices = [numpy_helper.to_array(weights[w]) for w in readers[x]]
                quantised[x], nodes, constants = _by_constants(x, p, [ranges[w] for w in readers[x]], matrices)
                graph.initializer.extend(constants)
            new += nodes
        codes = quantised[x]
        w = numpy_helper.to_array(weights[name]).astype(np.float32) * codes.smoothing[:, None]  # [in, out]
        weight_codes, scales = per_channel_int8(torch.from_numpy(w).t())  # the graph's weight is [in, out]
        graph.initializer.extend([numpy_helper.from_array(weight_codes.t().contiguous().numpy(), f"{name}/int8"),
                                  numpy_helper.from_array(scales.numpy(), f"{name}/scale")])
        new += codes.product(node.output[0], name)
        uses[name] -= 1
    kept = [i for i in graph.initializer if uses.get(i.name, 1) > 0]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    graph.node.extend(new)
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends external data to an existing file
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)


class _Codes:
    """An activation's uint8 codes in w8a8_products' graph and how a product by them is written: `scale`, the codes'
    scale as MatMulIntegerToFloat's a_scale (one for the call; 1 where each row has its own), `row_scale`, the rows'
    own scales to multiply the product by (None where there are none), and `smoothing`, what the weights' rows are
    multiplied by first (ones but for w8a8s)."""

    def __init__(self, codes: str, scale: str, row_scale: str | None, smoothing: np.ndarray) -> None:
        self.codes, self.scale, self.row_scale, self.smoothing = codes, scale, row_scale, smoothing

    def product(self, out: str, weight: str) -> list:
        """The nodes of the product by `weight`'s int8 codes and channel scales, written to `out`."""
        from onnx import helper

        inputs = [self.codes, f"{weight}/int8", self.scale, f"{weight}/scale", "specbench/w8a8/128"]
        if self.row_scale is None:
            return [helper.make_node("MatMulIntegerToFloat", inputs, [out], domain="com.microsoft")]
        by_channel = f"specbench/w8a8/{weight}/by_channel"
        return [helper.make_node("MatMulIntegerToFloat", inputs, [by_channel], domain="com.microsoft"),
                helper.make_node("Mul", [by_channel, self.row_scale], [out])]


def _per_row(x: str, p: str, zeros: list[str], own_zero: bool, width: int) -> tuple[_Codes, list]:
    """w8a8's codes of activation `x` (`width` channels), each row by its own scale (max |x| / 127); an all-zero row
    gets a scale of 0, so its product is 0 whatever its codes: no floor needed. The zero point is one a row
    (QuantizeLinear's blocks), one tensor for every product of the call's rows (`zeros`), its own where `own_zero`."""
    from onnx import helper

    nodes = [helper.make_node("Abs", [x], [f"{p}/abs"]),
             helper.make_node("ReduceMax", [f"{p}/abs", "specbench/w8a8/last_axis"], [f"{p}/max"]),
             helper.make_node("Div", [f"{p}/max", "specbench/w8a8/127"], [f"{p}/scale"])]
    if not zeros or own_zero:
        zeros.append(f"{p}/zero")
        nodes += [helper.make_node("Shape", [f"{p}/scale"], [f"{p}/scale_shape"]),
                  helper.make_node("Expand", ["specbench/w8a8/128", f"{p}/scale_shape"], [zeros[-1]])]
    nodes.append(helper.make_node("QuantizeLinear", [x, f"{p}/scale", zeros[-1]], [f"{p}/codes"], axis=-1,
                                  block_size=width))  # one block a row: its own scale
    return _Codes(f"{p}/codes", "specbench/w8a8/1", f"{p}/scale", np.ones(width, np.float32)), nodes


def _by_constants(x: str, p: str, ranges: list[np.ndarray], matrices: list[np.ndarray]) -> tuple[_Codes, list, list]:
    """w8a8s's codes of activation `x`: each channel by a constant scale, from the calibrated |x| of the products
    that read it (`ranges`) and their weights ([in, out] `matrices`), smoothed (w8a8_products says how); the nodes and
    the constants they read."""
    from onnx import helper, numpy_helper

    tiny = np.float32(1e-5)  # a channel the calibration never saw move, or a weight row of zeros
    seen = np.maximum(np.max(ranges, axis=0), tiny)
    weight = np.maximum(np.max([np.abs(m).max(1) for m in matrices], axis=0), tiny)
    smoothing = np.maximum(seen ** SMOOTHING / weight ** (1 - SMOOTHING), tiny).astype(np.float32)
    scale = np.float32((seen / smoothing).max() / 127)
    # a multiply by each channel's reciprocal, then QuantizeLinear by one scale of 1: MLAS's per-tensor kernel, where a
    # scale per channel (QuantizeLinear's axis) runs a slow loop (experiments/onnxruntime_verify, section "w8a8s")
    constants = [numpy_helper.from_array((1 / (smoothing * scale)).astype(np.float32), f"{p}/reciprocal"),
                 numpy_helper.from_array(scale, f"{p}/scale")]
    nodes = [helper.make_node("Mul", [x, f"{p}/reciprocal"], [f"{p}/scaled"]),
             helper.make_node("QuantizeLinear", [f"{p}/scaled", "specbench/w8a8/1", "specbench/w8a8/128"],
                              [f"{p}/codes"])]
    return _Codes(f"{p}/codes", f"{p}/scale", None, smoothing), nodes, constants


def add_verify_inputs(source: Path, out: Path) -> None:
    """`source`'s graph with `position_ids` (batch, attention rows) and `attention_bias` (1, 1, attention rows,
    cache + attention rows) as graph inputs, fed to every GroupQueryAttention node's optional inputs of those names
    (its 10th and 11th); `attention_rows` (attention rows,), the rows of the call gathered into each such node's packed
    query, key and value, and `attention_kept` (rows,), the rows of its output gathered for the layers after it; and
    `logits_rows` (k,), the rows gathered before the node that writes the logits; written to `out` beside it on the
    same weights file."""
    import onnx
    from onnx import TensorProto, helper

    graph = onnx.load(str(source), load_external_data=False)
    attentions = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    if not attentions:
        raise BuildFailed(f"the builder's graph {source} has no GroupQueryAttention node to verify trees with")
    if any(len(n.input) < 3 or n.input[1] or n.input[2] for n in attentions):
        raise BuildFailed(f"the builder's graph {source} feeds its attention unpacked keys and values")
    graph.graph.input.extend([
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "attention_length"]),
        helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT,
                                      [1, 1, "attention_length", "total_sequence_length"]),
        helper.make_tensor_value_info("attention_rows", TensorProto.INT64, ["attention_length"]),
        helper.make_tensor_value_info("attention_kept", TensorProto.INT64, ["sequence_length"])])
    nodes = graph.graph.node
    for i, node in enumerate(attentions):
        node.input.extend([""] * (11 - len(node.input)))
        node.input[9], node.input[10] = "position_ids", "attention_bias"
        packed, output = node.input[0], node.output[0]
        node.input[0], node.output[0] = f"specbench/attention_rows/{i}", f"specbench/attention_out/{i}"
        at = list(nodes).index(node)
        nodes.insert(at + 1, helper.make_node("Gather", [node.output[0], "attention_kept"], [output], axis=1))
        nodes.insert(at, helper.make_node("Gather", [packed, "attention_rows"], [node.input[0]], axis=1))
    head = next((n for n in graph.graph.node if "logits" in n.output), None)
    if head is None:
        raise BuildFailed(f"the builder's graph {source} has no node writing `logits`")
    graph.graph.input.append(helper.make_tensor_value_info("logits_rows", TensorProto.INT64, ["kept_rows"]))
    kept = "specbench/logits_rows/output_0"
    graph.graph.node.insert(list(graph.graph.node).index(head),
                            helper.make_node("Gather", [head.input[0], "logits_rows"], [kept], axis=1))
    head.input[0] = kept
    onnx.save(graph, str(out))


def float_prefill(verify: Path, out: Path) -> None:
    """`verify`'s graph with every quantised product (MatMulNBits) on float activations, written to `out` on the
    same weights file, where any of them multiplies by int8 ones. MLAS's int8-activation kernel is the faster one for a
    few rows and can be the slower for a prompt's hundreds, where its float kernel dequantises each weight block once
    for every row (experiments/onnxruntime_verify)."""
    import onnx

    graph = onnx.load(str(verify), load_external_data=False)
    levels = [a for n in graph.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"]
    if all(a.i == FLOAT_ACTIVATIONS for a in levels):
        return
    for level in levels:
        level.i = FLOAT_ACTIVATIONS
    onnx.save(graph, str(out))


@contextlib.contextmanager
def _quiet(name: str):
    """Logger `name` held at warnings: the builder's quantiser logs every layer it visits at info."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
