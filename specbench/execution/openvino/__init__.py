"""The `openvino` backend: the target's forward run by OpenVINO's CPU runtime, the cache and the loop left as they are.

Why: a small model's eager PyTorch forward is mostly dispatch, and its cost grows with the rows of a verify, where
OpenVINO's runtime runs the same layers as a few fused kernels (experiments/openvino_same_model). Compiling one graph
ahead of time is what the deployment engines do; here it serves every method's verify.

The modules, one concept each:

- `settings`: what the backend can run, checked before any model loads (check_run, unsupported, group_problem).
- `attention`: the attentions the export traces (split_attention; recent_attention for w4a8r) and the window inputs
  the host builds for the latter.
- `export`: the stateless IR of the forward (input embeddings, a 4D boolean mask, position ids and every layer's
  cached keys and values in; logits, every hidden state and the new rows' keys and values out), NNCF's compression,
  the IR cache and its key.
- `compile`: an IR compiled for this CPU, its static-shape copies and the memory budget bounding them.
- `forward`: OpenVinoForward, the runtime adapter the methods call (the run's DynamicCache fed in, the new rows
  appended, so cropping and committing a path work unchanged).
- `route`: a weight format's route (with_openvino). Weights: `fp` keeps the float32 weights; `int8` and
  `int4_g<group>` are compressed by NNCF (int8 symmetric per output channel; int4 asymmetric in groups, NNCF's grid
  with an integer zero point, which is not aten's grid of execution/quantize.py: an openvino int4 target is a target
  of its own); `w4a8_g<group>` is that int4 IR run with its activations quantised on the fly (compile.PROPERTIES says
  why apart), and `w4a8r_g<group>` runs it row-invariant, a lossless verify target.
- `linear`: OpenVinoLinear, a drafter's vocabulary projection in int8.
- `draft_head`: OpenVinoEagleHead, an EAGLE head's forward and draft LM head as one call per tree level.
"""

from specbench.execution.openvino.attention import RECENT_DEPTH, recent_attention, split_attention, window_inputs
from specbench.execution.openvino.compile import DYNAMIC_GROUP, STATIC_ROWS, quantises_activations
from specbench.execution.openvino.draft_head import OpenVinoEagleHead
from specbench.execution.openvino.export import (compressed, flat_cache, interrupt_after, ir_folder,
                                                quiet_transformers, save_whole, usable)
from specbench.execution.openvino.forward import OpenVinoForward
from specbench.execution.openvino.linear import OpenVinoLinear
from specbench.execution.openvino.route import claim, with_openvino
from specbench.execution.openvino.settings import (INSTALL, OWN_FORMATS, check_run, group_error, group_problem,
                                                  unsupported)

__all__ = ["DYNAMIC_GROUP", "INSTALL", "OWN_FORMATS", "RECENT_DEPTH", "STATIC_ROWS", "OpenVinoEagleHead",
           "OpenVinoForward", "OpenVinoLinear", "check_run", "claim", "compressed", "flat_cache", "group_error",
           "group_problem", "interrupt_after", "ir_folder", "quantises_activations", "quiet_transformers",
           "recent_attention", "save_whole", "split_attention", "unsupported", "usable", "window_inputs",
           "with_openvino"]
