"""Measure L(n): the latency of one target forward of n tokens on top of a cache of `context` tokens.

The ideal speedup tau * L(1) / L(n) and the hardware-aware tree budgets read this profile.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.execution.backends import PackedLinear, supported
from specbench.execution.quantize import quantised_linear
from specbench.execution.quantize import supported as weights_supported
from specbench.models.shape import ModelShape, bytes_per
from specbench.trees.token_tree import TokenTree
from specbench.verification import new_cache, verify_tree


@torch.inference_mode()
def latency_profile(model, sizes=(1, 2, 4, 8, 16, 32, 64), context: int | Sequence[int] = 128, repeats: int = 5,
                    hw: HardwareSpec | None = None, statistic: str = "median") -> pd.DataFrame:
    """Median (or min) ms per forward of a tree of n nodes (any tree shape of n nodes costs the same), per context.

    min suits a machine profile on a shared machine: interference from other processes only ever adds time."""
    contexts = [context] if isinstance(context, int) else list(context)
    frame = pd.concat([_at_context(model, sizes, ctx, repeats, statistic) for ctx in contexts], ignore_index=True)
    if hw is not None:
        shape = ModelShape.of(model)
        frame["roofline_ms"] = [1e3 * roofline_step_time(shape, hw, n, ctx)
                                for n, ctx in zip(frame["tokens"], frame["context"])]
    return frame


def _at_context(model, sizes, context: int, repeats: int, statistic: str) -> pd.DataFrame:
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = new_cache(model)  # the execution's own (a static one under the graphs backend)
    model(input_ids=torch.randint(0, vocab, (1, context), generator=gen, device="cpu").to(model.device),
          past_key_values=cache, use_cache=True)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    rows = []
    for n in tqdm(sizes, desc=f"L(n) at context {context}", unit="size", leave=False):
        star = torch.tensor([-1] + [0] * (n - 1))  # n - 1 children of the root: exercises the tree-mask path
        tree = TokenTree(torch.randint(0, vocab, (n,), generator=gen), star)
        times = []
        for _ in range(repeats + 1):
            sync()
            start = time.perf_counter()
            verify_tree(model, cache, tree)
            sync()
            times.append(time.perf_counter() - start)
            cache.crop(-n)
        timed = sorted(times[1:])
        rows.append({"context": context, "tokens": n, "ms": 1e3 * (timed[0] if statistic == "min" else
                                                                  timed[len(timed) // 2])})
    return pd.DataFrame(rows)


@torch.inference_mode()
def weight_streaming(model, sizes=(1, 2, 4, 8, 16, 32), repeats: int = 3, weights=()) -> pd.DataFrame:
    """ms and GB/s of the model's own linear layers multiplied one after another, as a forward does (so weights come
    from memory, not from cache), with eager's nn.Linear, the prepacked backend's layers and each quantised format in
    `weights` (int8, int4_g32: bfloat16 activations, the ones their kernels vectorise): how close each kernel gets to
    the read bandwidth at each width, which the roofline assumes it reaches. GB/s counts each layout's own bytes
    (an int8 layer reads a quarter of a float32 one)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weight = linears[0].weight
    layouts = {"eager": (linears, weight.dtype)}
    if supported("prepacked", weight.dtype, weight.device) is None:  # the prepacked backend's own layers
        layouts["prepacked"] = ([PackedLinear(m) for m in linears], weight.dtype)
    for fmt in weights:
        if fmt != "fp" and weights_supported(fmt, weight.device) is None:
            # cast a copy: a quantised layer keeps its source's float weight as .weight, which .to() would cast
            # in place under the model's own linears
            layouts[fmt] = ([quantised_linear(copy.deepcopy(m), fmt).to(torch.bfloat16) for m in linears],
                            torch.bfloat16)
    params = sum(m.weight.numel() for m in linears)
    rows = []
    for n in sizes:
        for name, (layers, dtype) in layouts.items():
            inputs = {m.in_features: torch.randn(n, m.in_features, dtype=dtype, device=weight.device) for m in linears}

            def chain():
                for layer in layers:
                    layer(inputs[layer.in_features])
            chain()
            best = min(_timed(chain) for _ in range(repeats))
            gb = params * (weight.element_size() if name in ("eager", "prepacked") else bytes_per(name)) / 1e9
            rows.append({"layout": name, "tokens": n, "ms": 1e3 * best, "gb_per_s": gb / best})
    return pd.DataFrame(rows)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
