"""ONNX Runtime GenAI's generator on the model its own builder writes from the run's full-precision target
(execution/onnxruntime/export.py): plain greedy decoding.

Why this engine: on a CPU without VNNI its int4 model multiplies int4 weights by int8 activations (MatMulNBits, the kind
of kernel llama.cpp runs) where OpenVINO's CPU plugin turns int8 and int4 weights back into floats first, and it
attends over a cache it keeps in place: on the AVX2-only EPYC it decodes faster than llama.cpp and OpenVINO GenAI
(experiments/onnxruntime_verify).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og

from specbench.decoding import Generation
from specbench.engines.base import Clock, Engine, EngineContext, EngineUnavailable
from specbench.execution.onnxruntime import BuildFailed, check_format, export

DEFAULT_WEIGHTS = "int4_g32"  # the builder's own default for a CPU
KEY = "eval.engine_options.onnxruntime.weights"


def check_weights(weights: str) -> None:
    check_format(weights, KEY)


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    mode = "plain"

    def __init__(self, folder: Path, weights: str, max_new_tokens: int, eos: set[int], threads: int) -> None:
        self.weights, self.max_new_tokens, self.eos, self.threads = weights, max_new_tokens, eos, threads
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        self.model = og.Model(config)

    def describe(self) -> dict:
        return {"version": og.__version__, "weights": self.weights, "threads": self.threads}

    def generate(self, prompt_ids: list[int]) -> Generation:
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + self.max_new_tokens)
        clock = Clock()
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt_ids)
        tokens: list[int] = []
        # each generate_next_token is one forward (the first one the prompt's) and one token
        while not generator.is_done() and len(tokens) < self.max_new_tokens:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
            clock.tokens(1)
            if tokens[-1] in self.eos:
                break
        return clock.generation(prompt_ids, tokens, self.max_new_tokens, self.eos)


def build(mode: str, ctx: EngineContext) -> OnnxRuntimeEngine:
    own = ctx.options.get("onnxruntime") or {}
    weights = str(own.get("weights") or DEFAULT_WEIGHTS)
    check_weights(weights)
    try:
        folder = export(ctx.loaded, weights)
    except BuildFailed as exc:
        raise EngineUnavailable(str(exc)) from None
    return OnnxRuntimeEngine(folder, weights, ctx.max_new_tokens, set(ctx.loaded.eos_token_ids), ctx.threads)
