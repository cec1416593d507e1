"""Where one plain decoding step of the target goes, per execution: the weight kernels, attention, the other aten ops
and the host time outside aten (transformers' Python), from torch.profiler around one-token forwards.

L(1) of the fastest execution is about twice its bytes' roofline (issue 20); this says which part of the gap each
remedy could close: a faster weight kernel, another attention kernel (`--attention eager` times transformers' eager
attention beside SDPA), or fewer host-side ops per layer (a compiled step). Every execution is timed in one process,
the fastest of `--repeats` steps.

    python experiments/fast_forward/step_breakdown.py [--contexts 128 1024] [--attention sdpa eager]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from specbench.config import CONF_DIR
from specbench.errors import SpecbenchError
from specbench.execution.backends import with_backend
from specbench.models.loading import with_dtype
from specbench.execution.quantize import with_weights
from specbench.tasks._common import build_model

EXECUTIONS = {"eager/float32/fp": ("eager", "float32", "fp"), "prepacked/float32/fp": ("prepacked", "float32", "fp"),
              "prepacked/bfloat16/fp": ("prepacked", "bfloat16", "fp"),
              "eager/bfloat16/int4_g32": ("eager", "bfloat16", "int4")}
# aten ops by part of the step (self time, so a composite op is not counted twice)
WEIGHTS = ("aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int8pack_mm", "mkldnn::_linear_pointwise",
           "aten::addmm", "aten::mm", "aten::linear", "aten::matmul")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
             "aten::bmm", "aten::_softmax", "aten::baddbmm")


@torch.inference_mode()
def breakdown(model, context: int, repeats: int) -> dict:
    cache = DynamicCache()
    model(input_ids=torch.randint(0, 1000, (1, context)), past_key_values=cache, use_cache=True)
    token = torch.randint(0, 1000, (1, 1))

    def step():
        model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)
    for _ in range(3):
        step()
    wall = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        wall.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            step()
    self_ms = {e.key: e.self_cpu_time_total / 1e3 / repeats for e in prof.key_averages()}
    weights = sum(ms for op, ms in self_ms.items() if op in WEIGHTS)
    attention = sum(ms for op, ms in self_ms.items() if op in ATTENTION)
    aten = sum(ms for op, ms in self_ms.items() if op.startswith(("aten::", "mkldnn::")))
    step_ms = 1e3 * min(wall)
    return {"step_ms": step_ms, "weight_kernels_ms": weights, "attention_ms": attention,
            "other_aten_ms": aten - weights - attention, "host_outside_aten_ms": step_ms - aten}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--attention", nargs="+", default=["sdpa", "eager"], choices=["sdpa", "eager"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("experiments/fast_forward/step_breakdown.csv"))
    args = parser.parse_args()
    for flag, values in (("--repeats", [args.repeats]), ("--contexts", args.contexts)):
        if min(values) < 1:  # no step to take the fastest of, or no cache to decode over
            parser.error(f"{flag} {min(values)} is invalid: give whole numbers >= 1")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=smollm2_135m"])
    base = build_model(cfg.model, dtype="float32")
    rows = []
    for name, (backend, dtype, weights) in EXECUTIONS.items():
        try:  # quantise the float32 model, then cast, then apply the backend: the evaluator's order
            model = with_backend(with_dtype(with_weights(base, weights), dtype), backend).model
        except SpecbenchError as exc:  # a CPU without packed bf16 says so in one line; the rest goes on
            print(f"{name}: not measured: {str(exc).splitlines()[0]}")
            continue
        for attention in args.attention:
            model.set_attn_implementation(attention)  # transformers' switch (views share their config: set each time)
            for context in args.contexts:
                rows.append({"execution": name, "attention": attention, "context": context}
                            | breakdown(model, context, args.repeats))
                print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    frame = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.precision", 2):
        print(frame.to_string(index=False))
    print(f"{torch.get_num_threads()} threads; {torch.backends.cpu.get_cpu_capability()}; fastest of {args.repeats} "
          f"steps; component times are profiled self times per step (the profiler adds a little to each op)")


if __name__ == "__main__":
    main()
