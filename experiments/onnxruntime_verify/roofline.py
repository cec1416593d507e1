"""The roofline of each side of step_speed.py's table on this machine: the bytes a step reads over the machine's
measured bandwidth, and its FLOPs over the machine's measured int8 peak, beside the step as measured.

The bytes are each side's own: the weights its linears and LM head read (for the route and ONNX Runtime GenAI, the
MatMulNBits initializers of the builder's graph; for the w8a8 and w8a8s routes, their int8 weights and scales; for llama.cpp,
the GGUF, whose embedding table is the tied LM head; for OpenVINO GenAI, the IR's weights file, an upper bound since
its embedding table is in it and a step reads one row)
and the cache at the context in the precision each keeps it (float32 in ONNX Runtime's shared buffer, float16 in
llama.cpp's default cache, the OpenVINO CPU plugin's KV_CACHE_PRECISION with a scale and zero point per token and
head). The FLOPs are the project's cost model's (hardware/modelled/ops.py) for n rows over the context. The peaks are
the machine profile's (hardware/measured/peaks.py: a streaming read, torch's int8 product), at torch's thread count.

    python experiments/onnxruntime_verify/roofline.py --steps experiments/onnxruntime_verify/steps_icelake.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import specbench  # noqa: F401  before torch: it shortens OpenMP's spin (specbench/openmp.py)
import onnx
import pandas as pd
from hydra import compose, initialize_config_dir

from specbench.config import CONF_DIR
from specbench.engines import openvino as openvino_engine
from specbench.execution.onnxruntime import export
from specbench.hardware.measured.peaks import measured_peaks
from specbench.hardware.modelled.ops import op_costs
from specbench.models.loading import load_model, resolve_path
from specbench.models.shape import ModelShape

ROUTE, W8A8, W8A8S, GENAI = "onnxruntime int4_g32", "onnxruntime w8a8", "onnxruntime w8a8s", "onnxruntime genai"
PRODUCTS = ("MatMulNBits", "MatMulIntegerToFloat")  # the quantised products of the builder's graph and of w8a8(s)'s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=Path, required=True, help="a CSV step_speed.py wrote")
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={args.model}"])
    loaded = load_model(cfg.model.name, cfg.model.path, dtype="float32")
    shape = ModelShape.of(loaded.model)
    peaks = measured_peaks("cpu")
    bandwidth, int8 = peaks["mem_bandwidth_gbs"] * 1e9, peaks["peak_tflops"]["w8a8"] * 1e12
    print(f"this machine: {bandwidth / 1e9:.1f} GB/s streaming read, {int8 / 1e12:.3f} TFLOP/s int8 "
          f"(hardware/measured/peaks.py)")

    onnx_weights = product_bytes(export(loaded, "int4_g32") / "model.onnx")
    sides = {  # side -> (weight bytes a step, cache bytes a token)
        ROUTE: (onnx_weights, cache_bytes(shape, 4.0)),
        W8A8: (product_bytes(export(loaded, "w8a8") / "model.onnx"), cache_bytes(shape, 4.0)),
        W8A8S: (product_bytes(export(loaded, "w8a8s") / "model.onnx"), cache_bytes(shape, 4.0)),
        GENAI: (onnx_weights, cache_bytes(shape, 4.0)),
        "llama.cpp": (resolve_path(cfg.model.path).stat().st_size, cache_bytes(shape, 2.0)),
        "openvino genai": (ir_bytes(openvino_engine.export(loaded, "int8")), cache_bytes(shape, *openvino_cache())),
    }
    steps = pd.read_csv(args.steps)
    rows = []
    for step in steps[steps["side"].isin(sides)].itertuples():
        weights, per_token = sides[step.side]
        nbytes = weights + per_token * (step.context + step.rows)
        flops = op_costs(shape, step.rows, step.context)["flops"].sum()
        roof = max(nbytes / bandwidth, flops / int8) * 1e3
        rows.append({"context": step.context, "side": step.side, "rows": step.rows, "MB a step": nbytes / 1e6,
                     "GFLOP a step": flops / 1e9, "roofline ms": roof, "measured ms": step.ms,
                     "x roofline": step.ms / roof})
    table = pd.DataFrame(rows).sort_values(["context", "side", "rows"])
    for context, group in table.groupby("context"):
        print(f"\ncontext {context}:")
        print(group.drop(columns="context").set_index(["side", "rows"]).round(2).to_string())
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"\nwritten: {args.out}")


def product_bytes(model: Path) -> int:
    """The bytes of every initializer a quantised product reads (MatMulNBits' int4 weights, scales and zero points;
    w8a8's int8 weights and scales), from the graph's external-data records: the weights a one-row step streams."""
    graph = onnx.load(str(model), load_external_data=False).graph
    sizes = {}
    for tensor in graph.initializer:
        length = {entry.key: entry.value for entry in tensor.external_data}.get("length")
        sizes[tensor.name] = int(length) if length is not None else len(tensor.raw_data)
    read = {name for node in graph.node if node.op_type in PRODUCTS for name in node.input if name in sizes}
    return sum(sizes[name] for name in read)


def ir_bytes(folder: Path) -> int:
    """An OpenVINO IR's weights file."""
    return sum(path.stat().st_size for path in folder.glob("*.bin") if "tokenizer" not in path.name)


def openvino_cache() -> tuple[float, float]:
    """(bytes an element, bytes a token and head beside them) of the CPU plugin's cache: its KV_CACHE_PRECISION, and
    a float32 scale and zero point per token and head where it quantises (its group size 0: one group a head)."""
    import openvino as ov

    precision = ov.Core().get_property("CPU", "KV_CACHE_PRECISION")
    size = precision.size
    return float(size), (8.0 if size == 1 else 0.0)


def cache_bytes(shape: ModelShape, element: float, per_head: float = 0.0) -> float:
    """Bytes of keys and values a cached token holds across every layer."""
    return 2 * shape.layers * shape.kv_heads * (shape.head_dim * element + per_head)


if __name__ == "__main__":
    main()
