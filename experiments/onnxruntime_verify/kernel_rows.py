"""What a row more costs ONNX Runtime's int4 kernel alone, by int4 group size and accuracy level: the target's int4
products (every layer's seven and the LM head, SmolLM2-135M's shapes by default) as MatMulNBits nodes of one graph on
random weights, timed at 1, 2, 4, 8 and 16 rows. No attention, no cache, no Python between the products: the kernel's
cost of a verify's rows, which the route's graph cannot change but its weight format can.

    python experiments/onnxruntime_verify/kernel_rows.py [--groups 32 64 128 256] [--levels 4] [--rounds 2]

accuracy level 4 quantises the activations to int8 per block (the builder's CPU default); 1 multiplies in float32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

ROWS = (1, 2, 4, 8, 16)


def graph(hidden: int, inner: int, kv: int, vocab: int, layers: int, group: int, level: int) -> bytes:
    """One graph of every int4 product of the model, each reading `x` (hidden wide) or `xi` (inner wide)."""
    import onnx
    from onnx import TensorProto, helper

    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, inner), (hidden, inner),
              (inner, hidden)] * layers + [(hidden, vocab)]
    rng = np.random.default_rng(0)
    nodes, weights, outputs = [], [], []
    for j, (k, n) in enumerate(shapes):
        blocks = -(-k // group)
        packed = rng.integers(0, 256, size=(n, blocks, group // 2), dtype=np.uint8)
        scales = rng.random(n * blocks, dtype=np.float32) * 0.01 + 0.001
        weights += [helper.make_tensor(f"b{j}", TensorProto.UINT8, packed.shape, packed.tobytes(), raw=True),
                    helper.make_tensor(f"s{j}", TensorProto.FLOAT, scales.shape, scales.tobytes(), raw=True)]
        nodes.append(helper.make_node("MatMulNBits", ["x" if k == hidden else "xi", f"b{j}", f"s{j}"], [f"y{j}"],
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=group,
                                      accuracy_level=level))
        outputs.append(helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", hidden]),
              helper.make_tensor_value_info("xi", TensorProto.FLOAT, ["rows", inner])]
    model = helper.make_model(helper.make_graph(nodes, "int4_products", inputs, outputs, weights),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--levels", type=int, nargs="+", default=[4])
    parser.add_argument("--rounds", type=int, default=2, help="every group and level timed this many times, in turn")
    parser.add_argument("--calls", type=int, default=15, help="timed calls per row count (after 3 untimed)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", type=int, nargs=5, default=[576, 1536, 192, 49152, 30],
                        metavar=("HIDDEN", "INNER", "KV", "VOCAB", "LAYERS"))
    args = parser.parse_args()
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    hidden, inner = args.shape[0], args.shape[1]
    sessions = {(g, level): ort.InferenceSession(graph(*args.shape, g, level), options,
                                                 providers=["CPUExecutionProvider"])
                for g in args.groups for level in args.levels}
    times = {key: {rows: [] for rows in ROWS} for key in sessions}
    for _ in range(args.rounds):
        for key, session in sessions.items():
            for rows in ROWS:
                feed = {"x": np.random.rand(rows, hidden).astype(np.float32),
                        "xi": np.random.rand(rows, inner).astype(np.float32)}
                for _ in range(3):
                    session.run(None, feed)
                for _ in range(args.calls):
                    start = time.perf_counter()
                    session.run(None, feed)
                    times[key][rows].append((time.perf_counter() - start) * 1e3)
    print(f"ms a call, median of {args.rounds} x {args.calls} (onnxruntime {ort.__version__}, {args.threads} threads)")
    print("group  level " + "".join(f"{r:>8} row" for r in ROWS) + "   L(4)/L(1)")
    for (g, level), by_rows in times.items():
        ms = [statistics.median(by_rows[r]) for r in ROWS]
        print(f"{g:5d}  {level:5d} " + "".join(f"{m:12.2f}" for m in ms) + f"   {ms[2] / ms[0]:9.2f}")


if __name__ == "__main__":
    main()
