"""The target built for ONNX Runtime by ONNX Runtime GenAI's own model builder (onnxruntime_genai.models.builder), once
per machine: the generator's model (`model.onnx`, what the engine decodes with) and the same graph with more inputs
for a verify (`verify.onnx`): `position_ids`, a tree node's position, and `attention_bias`, the additive mask that
keeps a node from its non-ancestors, both read by the builder's GroupQueryAttention nodes, which take them as optional
inputs; `attention_rows` and `attention_kept`, the call's rows each attention node runs (a pad row repeats the last)
and those it hands on, so a one-row call can pad its attention alone (forward.py says why); and `logits_rows`, the
rows the LM head projects (a prompt's last ones, not all of them); and, where its products take int8 activations,
`prefill.onnx`, the verify graph with every int4 or int8 product on float activations, which a long prompt may run
faster (forward.py measures from how many rows). The files share one weights file.

On a CPU the builder's int4 and int8 models multiply by int8 activations (MatMulNBits at accuracy level 4) and attend
with GroupQueryAttention over a cache held in place. Cached under cache_root()/onnxruntime, keyed by the model's
source, the weight format and the versions that shape it, and written whole (a temporary folder, renamed).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import tempfile
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.execution.openvino import interrupt_after, quiet_transformers, save_whole, usable
from specbench.execution.openvino.export import model_key
from specbench.models.loading import LoadedModel, cache_root, with_dtype

INT4_GROUPS = (16, 32, 64, 128, 256)  # the block sizes MatMulNBits takes
WHAT = "ONNX Runtime GenAI model"
# what add_verify_inputs writes and how the builder is asked for the weights (v4: the group by its own key; v5: the
# prefill graph beside it); part of the cache key, so a changed layout is built again
LAYOUT = "verify_v5"
PREFILL_GRAPH = "prefill.onnx"
FLOAT_ACTIVATIONS = 1  # MatMulNBits' accuracy_level for float32 activations (4 multiplies by int8 ones)


class BuildFailed(Exception):
    """The builder cannot build this model (an architecture it does not know): the caller says so in one line."""


def check_format(weights: str, key: str) -> None:
    """One error line for weights the builder cannot write: fp32, int8 or int4_g<group> (group 16 to 256)."""
    head, _, group = str(weights).partition("_g")
    if head in ("fp32", "int8") and not group:
        return
    if head == "int4" and group.isdigit() and int(group) in INT4_GROUPS:
        return
    raise SpecbenchError(f"{key}={weights!r} is invalid: give fp32, int8 or int4_g<group> with a group of "
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
