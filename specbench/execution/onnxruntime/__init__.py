"""The `onnxruntime` backend: the target's forward run by ONNX Runtime on the graph ONNX Runtime GenAI's builder writes,
the cache and the loop left as they are.

Why: on a CPU without int8 dot products (VNNI) OpenVINO's CPU plugin turns int8 and int4 weights back into floats in
every fully connected layer, where ONNX Runtime's MatMulNBits multiplies int4 or int8 weights by int8 activations, the
kind of kernel llama.cpp runs, and its GroupQueryAttention reads and writes the cache in place
(experiments/onnxruntime_verify).

- `export`: the builder's model and its verify graph (position ids and an attention bias fed to the attention), cached.
- `forward`: OnnxRuntimeForward, the runtime adapter the methods call, batch 1, every call at least two rows.
- `route`: a weight format's route (with_onnxruntime): fp, int8, int4_g<group>, w8a8 and w8a8s
  (export.w8a8_products).
"""

from specbench.execution.onnxruntime.export import INT4_GROUPS, OWN_FORMATS, BuildFailed, check_format, export
from specbench.execution.onnxruntime.forward import OnnxRuntimeForward
from specbench.execution.onnxruntime.route import check_run, unsupported, weights_problem, with_onnxruntime

__all__ = ["INT4_GROUPS", "OWN_FORMATS", "BuildFailed", "OnnxRuntimeForward", "check_format", "check_run", "export",
           "unsupported", "weights_problem", "with_onnxruntime"]
