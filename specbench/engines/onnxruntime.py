"""ONNX Runtime GenAI's generator on a model its own builder (onnxruntime_genai.models.builder) writes from the run's
full-precision target: plain greedy decoding.

Why this engine: on a CPU without VNNI its int4 model multiplies int4 weights by int8 activations (MatMulNBits at
accuracy level 4, the kind of kernel llama.cpp runs) and attends with GroupQueryAttention over a cache it keeps in
place, where OpenVINO's CPU plugin turns int8 and int4 weights back into floats first; on the AVX2-only EPYC it
decodes faster than llama.cpp and OpenVINO GenAI (experiments/onnxruntime_verify).

The model is built once per machine from the target saved as a transformers folder, cached like the OpenVINO IR
(cache_root()/onnxruntime), keyed by the model's source, the weight format and the versions that shape it, and
written whole (a temporary folder, renamed).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import re
import tempfile
from pathlib import Path

import onnxruntime_genai as og

from specbench.decoding import Generation
from specbench.engines.base import Clock, Engine, EngineContext, EngineUnavailable
from specbench.errors import SpecbenchError
from specbench.execution.openvino import interrupt_after, quiet_transformers, save_whole, usable
from specbench.models.loading import LoadedModel, cache_root, with_dtype

WEIGHTS = ("int4", "int8", "fp32")  # the builder's precisions a CPU runs (int4: groups of 32, int8 activations)
DEFAULT_WEIGHTS = "int4"
KEY = "eval.engine_options.onnxruntime.weights"


def check_weights(weights: str) -> None:
    if weights not in WEIGHTS:
        raise SpecbenchError(f"{KEY}={weights!r} is invalid: give one of {', '.join(WEIGHTS)}")


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


def model_folder(loaded: LoadedModel, weights: str) -> Path:
    """Where the builder's model of `loaded` in `weights` is cached: keyed by the model's source and config, two of
    its weights, and the onnxruntime-genai and transformers versions."""
    import transformers

    params = list(loaded.model.parameters())
    first, last = (p.detach().float().sum().item() for p in (params[0], params[-1]))
    identity = f"{loaded.source}:{loaded.model.config.to_json_string()}:{first}:{last}"
    key = hashlib.sha1(f"{identity}:{og.__version__}:{transformers.__version__}".encode()).hexdigest()[:10]
    return cache_root() / "onnxruntime" / f"{loaded.name}-{key}-genai-{weights}"


def export(loaded: LoadedModel, weights: str) -> Path:
    """The builder's model of `loaded` (its float weights) in `weights`, with its tokenizer and genai_config.json:
    cached, built once (and again when the cached one is unusable)."""
    folder = model_folder(loaded, weights)
    if usable(folder, "ONNX Runtime GenAI model"):
        return folder
    print(f"notice: building {loaded.name} for ONNX Runtime GenAI ({weights}) once, into {folder}")
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    fp32 = with_dtype(loaded, "float32")

    def save(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            source = Path(scratch) / "model"
            fp32.model.save_pretrained(source)
            fp32.tokenizer.save_pretrained(source)
            # the builder prints a progress line per tensor and its quantiser logs one per layer; a failure still raises
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    quiet_transformers(), _quiet("onnxruntime"), interrupt_after("the model builder"):
                where = (str(source), str(tmp), weights, "cpu", str(Path(scratch) / "cache"))
                create_model(None, *where, **parse_extra_options(None, *where, []))

    try:
        save_whole(folder, save)
    except (ValueError, NotImplementedError, KeyError) as exc:  # an architecture the builder does not know
        why = re.sub(r"\s+", " ", str(exc))[:200]
        raise EngineUnavailable(f"the ONNX Runtime GenAI builder cannot build {loaded.name}: {why}") from None
    return folder


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


def build(mode: str, ctx: EngineContext) -> OnnxRuntimeEngine:
    own = ctx.options.get("onnxruntime") or {}
    weights = str(own.get("weights") or DEFAULT_WEIGHTS)
    check_weights(weights)
    return OnnxRuntimeEngine(export(ctx.loaded, weights), weights, ctx.max_new_tokens,
                             set(ctx.target.eos_token_ids), ctx.threads)
