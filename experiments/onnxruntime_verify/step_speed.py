"""The onnxruntime route's verify beside the engines' one-row step on this machine, side by side in one process,
interleaved; and what its rows compute against plain decoding's.

For each context (one random prompt of that many tokens for every side): the onnxruntime routes' verify of a chain of
n rows (int4_g32, the builder's, and w8a8 and w8a8s, export.w8a8_products), L(n) for n = 1, 2, 3, 4, 8, 16 (n = 1 pads its
attention, or the whole call, to two rows: forward.py says why), and the openvino int8 route's (the previous verify
target) at 1, 2 and 4 rows, each on the prompt's cache and then cropped back as a rejected draft leaves it; and the
one-row step of ONNX Runtime GenAI (the builder's int4 model, its own loop), OpenVINO GenAI (an int8 IR) and
llama.cpp (the GGUF as shipped). The median of every side, with its ratio to the fastest engine's step. Then each
onnxruntime route's rows: the machine's row check on its chains, and how far a one-row call (its attention padded, and
nothing padded) is from the same row in a call of two.

    python experiments/onnxruntime_verify/step_speed.py [--contexts 128 512 1024 2048] [--rounds 3] [--steps 16]
        [--out experiments/onnxruntime_verify/steps.csv] [--routes 'onnxruntime int4_g32' 'onnxruntime w8a8']
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import json
import statistics
import time
from pathlib import Path

import specbench  # noqa: F401  before torch: it shortens OpenMP's spin (specbench/openmp.py)
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

from specbench.config import CONF_DIR
from specbench.execution.value import Execution
from specbench.hardware.measured.row_invariance import check_rows
from specbench.models.loading import load_model

ROUTES = {"onnxruntime int4_g32": (("onnxruntime", "int4_g32"), (1, 2, 3, 4, 8, 16)),
          "onnxruntime w8a8": (("onnxruntime", "w8a8"), (1, 2, 3, 4, 8, 16)),
          "onnxruntime w8a8s": (("onnxruntime", "w8a8s"), (1, 2, 3, 4, 8, 16)),
          "openvino int8": (("openvino", "int8"), (1, 2, 4))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16, help="steps timed per side and round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--routes", nargs="+", choices=list(ROUTES), default=list(ROUTES), metavar="ROUTE",
                        help=f"our routes to time (default all: {', '.join(map(repr, ROUTES))})")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={args.model}"])
    loaded = load_model(cfg.model.name, cfg.model.path, dtype="float32")
    sides = {name: Route(loaded, *execution, rows) for name, (execution, rows) in ROUTES.items() if name in args.routes}
    other = openvino_sides()
    sides |= {"onnxruntime genai": OrtGenAI(loaded, threads),
              "openvino genai": OneRow(other.GenAI(loaded, "int8", threads, "PA")),
              "llama.cpp": OneRow(other.LlamaCpp(cfg.model.path, max(args.contexts) + args.steps + 32, threads))}
    generator = torch.Generator().manual_seed(0)
    records = []
    for context in args.contexts:
        prompt = torch.randint(100, loaded.model.config.vocab_size - 100, (context,), generator=generator).tolist()
        steps = collections.defaultdict(list)
        for side in sides.values():
            side.run(prompt[:64], 2)  # warm: each side's sessions and caches allocated once
        for _ in range(args.rounds):
            for name, side in sides.items():
                for rows, times in side.run(prompt, args.steps).items():
                    steps[(name, rows)] += times
        for (name, rows), times in sorted(steps.items()):
            records.append({"context": context, "side": name, "rows": rows, "ms": statistics.median(times)})
        table = pd.DataFrame([r for r in records if r["context"] == context]).set_index(["side", "rows"])
        fastest = min(table.loc[(engine, 1), "ms"] for engine in ("onnxruntime genai", "openvino genai", "llama.cpp"))
        table["/ fastest engine step"] = (table["ms"] / fastest).round(2)
        print(f"\ncontext {context} ({threads} threads), ms (median of {args.rounds} x {args.steps}):")
        print(table.round(2).to_string())
    for name in (n for n in args.routes if n.startswith("onnxruntime")):
        print(f"\n{name}:")
        rows_of(sides[name].model, loaded)
    if args.out:
        pd.DataFrame(records).to_csv(args.out, index=False)
        print(f"\nwritten: {args.out}")


class Route:
    """A verify route (model.backend, model.weights) as the Decoder runs it."""

    def __init__(self, loaded, backend: str, weights: str, rows: tuple[int, ...]) -> None:
        self.model, self.rows = Execution(backend, "float32", weights).apply(loaded).model, rows
        self.threads = getattr(self.model, "torch_threads", None) or torch.get_num_threads()

    @torch.inference_mode()
    def run(self, prompt: list[int], steps: int) -> dict:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)  # as the Decoder runs it (decoding.Decoder.generate)
        try:
            cache = DynamicCache(config=self.model.config)
            self.model(input_ids=torch.tensor([prompt]), past_key_values=cache, logits_to_keep=1)
            return openvino_sides().chain_steps(self.model, cache, prompt, self.rows, steps)
        finally:
            torch.set_num_threads(before)


class OrtGenAI:
    """ONNX Runtime GenAI's generator on the builder's int4_g32 model (the project's `onnxruntime` engine)."""

    def __init__(self, loaded, threads: int) -> None:
        import onnxruntime_genai as og

        from specbench.execution.onnxruntime import export

        config = og.Config(str(export(loaded, "int4_g32")))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        self.og, self.model = og, og.Model(config)

    def run(self, prompt: list[int], steps: int) -> dict:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + steps + 1)
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(prompt)
        generator.generate_next_token()  # the prompt's forward
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            generator.generate_next_token()
            times.append((time.perf_counter() - start) * 1000)
        return {1: times}


class OneRow:
    """An engine side of ../openvino_engine_speed/step_speed.py (OpenVINO GenAI, llama.cpp), its steps alone."""

    def __init__(self, side) -> None:
        self.side = side

    def run(self, prompt: list[int], steps: int) -> dict:
        return self.side.run(prompt, steps)[0]


@functools.cache
def openvino_sides():
    """../openvino_engine_speed/step_speed.py as a module: its GenAI and LlamaCpp sides, not written twice."""
    path = Path(__file__).parents[1] / "openvino_engine_speed" / "step_speed.py"
    spec = importlib.util.spec_from_file_location("openvino_step_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@torch.inference_mode()
def rows_of(model, loaded) -> None:
    """The route's rows against plain decoding's: the machine's row check on chains (what the Decoder verifies
    there), and a row called alone, its attention padded (the forward's one-row call where the machine keeps a lone
    row's bits) and with nothing padded, against the same row first in a call of two."""
    from specbench.execution.onnxruntime import forward as route_forward

    check = check_rows(model, torch.float32, loaded.model.config.vocab_size)
    print(f"\nrow check (chains, as the Decoder verifies on this route): {check.verdict}: {check.describe()}")
    print(f"the forward pads a one-row call's {'attention alone' if model.attention_pad else 'every layer'}")
    prompt, tokens = torch.arange(100, 164)[None], torch.tensor([[500, 600]])
    chosen = model.attention_pad
    model.attention_pad = True
    try:
        for min_rows, how in ((2, "its attention padded"), (1, "nothing padded")):
            route_forward.MIN_ROWS = min_rows
            cache = DynamicCache(config=model.config)
            model(input_ids=prompt, past_key_values=cache)
            alone = model(input_ids=tokens[:, :1], past_key_values=cache).logits[0, 0]
            cache.crop(-1)
            pair = model(input_ids=tokens, past_key_values=cache).logits[0, 0]
            print(f"one row, {how}, against the same row in a call of two: logits up to "
                  f"{float((alone - pair).abs().max()):.3g} apart (logits up to {float(pair.abs().max()):.3g})")
    finally:
        route_forward.MIN_ROWS, model.attention_pad = 2, chosen


if __name__ == "__main__":
    main()
