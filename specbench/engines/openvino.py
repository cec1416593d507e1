"""OpenVINO GenAI's LLMPipeline on an IR exported here from the run's own full-precision target: plain greedy
decoding, its prompt lookup (a continuous-batching pipeline with `prompt_lookup=True`) and its speculative decoding
with a draft model (the project's distilled draft, eval.engine_options.openvino.draft_checkpoint, exported the same
way).

Why the export is written here and not left to optimum-intel: optimum-intel's exporter pins transformers < 5.6, and
the project runs 5.24. The IR is what GenAI expects of an optimum export, built with OpenVINO's own API: the model
traced by `openvino.convert_model` with its KV cache as inputs and outputs, a `beam_idx` input gathering each cached
tensor along the batch (GenAI passes it every step), the cache made internal state (OpenVINO's MakeStateful pass),
each state starting empty for the batch of `input_ids`; the tokenizer converted by openvino-tokenizers. Weights are
compressed by NNCF (int8 per channel, or int4 in groups; NNCF keeps the embedding and the head in int8 for int4, its
default), or kept fp32/fp16. The IR is cached like the GGUF conversion (cache_root()/openvino), keyed by the model's
source, the weight format and the versions that shape the IR, and written whole (a temporary folder, renamed).
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as og
import torch
from openvino import opset13

from specbench.decoding import Generation
from specbench.engines.base import Clock, Engine, EngineContext, EngineUnavailable
from specbench.errors import SpecbenchError
from specbench.models.distilled_draft import load_distilled_draft
from specbench.execution.openvino import (compressed, flat_cache, group_problem, interrupt_after, ir_folder,
                                         quiet_transformers, save_whole, usable)
from specbench.models.loading import LoadedModel, with_dtype
from specbench.models.shape import head_dim

log = logging.getLogger(__name__)
WEIGHTS = re.compile(r"fp32|fp16|int8|int4_g(\d+)")
DEFAULT_WEIGHTS = "int4_g64"  # experiments/engines' export (group 128 does not divide SmolLM2's 576 channels)


def check_weights(weights: str, config=None, key: str = "eval.engine_options.openvino.weights") -> None:
    """An IR's weights (`key` names the setting): fp32, fp16, int8 or int4_g<group>, a group dividing every linear's
    input width when the model's config is known."""
    match = WEIGHTS.fullmatch(str(weights))
    if match is None:
        raise SpecbenchError(f"{key}={weights!r} is invalid: give fp32, fp16, int8 or int4_g<group> (e.g. int4_g64)")
    problem = group_problem(config, weights)
    if problem:
        raise SpecbenchError(f"{key}={weights} is invalid for this model: {problem}")


def check_exportable(config, name: str) -> None:
    """Refuse, before any weights load, a model this exporter cannot make stateful: an encoder-decoder, or layers
    with a sliding-window cache (their state would not simply grow by concatenation, as GenAI's state expects)."""
    if config is None:
        return
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    window = " with a sliding window" if getattr(config, "sliding_window", None) else ""
    if getattr(config, "is_encoder_decoder", False) or kinds != {"full_attention"} or window:
        raise SpecbenchError(f"eval.engines entry 'openvino' cannot export model {name}: its layers are "
                             f"{', '.join(sorted(kinds))}{window}, and this exporter makes only full-attention decoder "
                             f"caches stateful; drop the openvino entries for this model")


class _Stream(og.StreamerBase):
    """GenAI hands the streamer the tokens of each step (one, or several where drafts were accepted)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def write(self, token) -> og.StreamingStatus:
        self.clock.tokens(len(token) if isinstance(token, list) else 1)
        return og.StreamingStatus.RUNNING

    def end(self) -> None:
        pass


class OpenVinoEngine(Engine):
    name = "openvino"

    def __init__(self, folder: Path, weights: str, max_new_tokens: int, eos: set[int], mode: str, threads: int,
                 lookup_tokens: int, lookup_ngram: int, draft: tuple[Path, str] | None = None,
                 draft_tokens: int = 4) -> None:
        self.weights, self.max_new_tokens, self.eos = weights, max_new_tokens, eos
        self.mode, self.threads = mode, threads
        # each prompt from an empty cache, as llama.cpp's after its reset(): built without a scheduler config, GenAI
        # reuses the previous call's cache for a repeated prompt, so the first prompt's prefill (the warm-up's prompt)
        # came from its cache (experiments/openvino_engine_speed)
        scheduler = og.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        properties = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "scheduler_config": scheduler}
        self.config = og.GenerationConfig()
        self.config.max_new_tokens, self.config.do_sample = max_new_tokens, False
        self.config.stop_token_ids = set(eos)
        self.options = {}
        if mode == "prompt_lookup":
            properties["prompt_lookup"] = True
            self.config.num_assistant_tokens, self.config.max_ngram_size = lookup_tokens, lookup_ngram
            self.options = {"lookup_tokens": lookup_tokens, "lookup_ngram": lookup_ngram}
        elif mode == "draft":
            properties["draft_model"] = og.draft_model(str(draft[0]), "CPU", INFERENCE_NUM_THREADS=threads)
            self.config.num_assistant_tokens = draft_tokens
            self.options = {"draft": draft[1], "draft_tokens": draft_tokens}
        self.pipe = og.LLMPipeline(str(folder), "CPU", **properties)

    def describe(self) -> dict:
        return {"version": og.__version__.split("-")[0], "weights": self.weights, "threads": self.threads,
                **self.options}

    def generate(self, prompt_ids: list[int]) -> Generation:
        ids = np.asarray([prompt_ids], dtype=np.int64)
        inputs = og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        clock = Clock()
        result = self.pipe.generate(inputs, self.config, _Stream(clock))
        tokens = [int(t) for t in result.tokens[0]]
        return clock.generation(prompt_ids, tokens, self.max_new_tokens, self.eos)


class BatchAnswerer:
    """Greedy answers to many prompts at once, by GenAI's continuous-batching pipeline on an IR of export(): up to
    `sequences` of them decode together, each from its own empty cache, so a corpus of answers costs what a batch
    step costs, not a one-row step per token (datastore=self_distilled's `generator: openvino`). Each answer is cut
    after its first EOS, which it keeps, as the eager loop's are. The pipeline is built on the first answer, so a
    rerun whose answers are all cached compiles nothing."""

    def __init__(self, folder: Path, max_new_tokens: int, eos: set[int], sequences: int) -> None:
        self.folder, self.sequences = folder, sequences
        self.config = og.GenerationConfig()
        self.config.max_new_tokens, self.config.do_sample = max_new_tokens, False
        self.config.stop_token_ids = set(eos)
        self.eos = eos

    @functools.cached_property
    def pipe(self) -> og.ContinuousBatchingPipeline:
        scheduler = og.SchedulerConfig()
        scheduler.max_num_seqs, scheduler.enable_prefix_caching = self.sequences, False
        scheduler.cache_size = 2  # GiB of KV blocks: a 135M model's sequences need a few MiB each
        return og.ContinuousBatchingPipeline(str(self.folder), scheduler, "CPU", {"PERFORMANCE_HINT": "LATENCY"})

    def answer(self, prompts: list[list[int]]) -> list[list[int]]:
        results = self.pipe.generate([ov.Tensor(np.asarray([p], dtype=np.int64)) for p in prompts],
                                     [self.config] * len(prompts))
        answers = []
        for result in results:
            tokens = [int(t) for t in result.m_generation_ids[0]]
            cut = next((i + 1 for i, t in enumerate(tokens) if t in self.eos), len(tokens))
            answers.append(tokens[:cut])
        return answers


def export(loaded: LoadedModel, weights: str) -> Path:
    """The stateful IR of `loaded` (its float weights) in `weights`, with its tokenizer: cached, exported once (and
    again when the cached one is unusable)."""
    folder = ir_folder(loaded, f"genai-{weights}")
    if usable(folder):
        return folder
    print(f"notice: exporting {loaded.name} to an OpenVINO IR ({weights}) once, into {folder}")
    model = with_dtype(loaded, "float32").model
    ir = stateful_ir(model)

    def save(tmp: Path) -> None:
        with interrupt_after("compression and saving of the IR"):
            ov.save_model(compressed(ir, weights), tmp / "openvino_model.xml", compress_to_fp16=weights == "fp16")
            _save_tokenizer(loaded.tokenizer, tmp)
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)

    save_whole(folder, save)
    return folder


def stateful_ir(model: torch.nn.Module) -> ov.Model:
    """`model` traced with its cache as inputs/outputs, then made stateful the way GenAI expects (module docstring)."""
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    width = head_dim(config)
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    example = (torch.ones(1, 3, dtype=torch.long), torch.ones(1, 5, dtype=torch.long), torch.arange(2, 5)[None],
               *[torch.zeros(1, kv_heads, 2, width) for _ in past])
    try:  # the trace's warnings are about code paths of the model it specialises, nothing a user acts on
        with torch.no_grad(), warnings.catch_warnings(), quiet_transformers(), \
                interrupt_after("conversion of the model"):
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
            # the frontend reads every module attribute, a deprecated property among them
            warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            ir = ov.convert_model(_CacheAsTensors(model), example_input=example)
    except Exception as exc:  # noqa: BLE001  (the frontend raises its own types; any of them leaves the row out)
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise EngineUnavailable(f"openvino.convert_model failed: {lines[-1][:200] if lines else type(exc).__name__}")
    for port, name in zip(ir.inputs, ["input_ids", "attention_mask", "position_ids", *past]):
        port.get_tensor().set_names({name})
        port.get_node().set_partial_shape(ov.PartialShape([-1, kv_heads, -1, width] if "past" in name else [-1, -1]))
    for port, name in zip(ir.outputs, ["logits", *present]):
        port.get_tensor().set_names({name})
    ir.validate_nodes_and_infer_types()
    beam_idx = opset13.parameter(name="beam_idx", dtype=ov.Type.i32, shape=ov.PartialShape([-1]))
    beam_idx.output(0).get_tensor().add_names({"beam_idx"})
    ir.add_parameters([beam_idx])
    for name in past:  # each cached tensor reordered along the batch by beam_idx before use
        port = ir.input(name)
        consumers = port.get_target_inputs()
        gathered = opset13.gather(port, beam_idx, opset13.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(gathered.output(0))
    ir.validate_nodes_and_infer_types()
    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(ir, dict(zip(past, present)))
    batch = opset13.gather(opset13.shape_of(ir.input("input_ids"), output_type="i64"), opset13.constant([0]),
                           opset13.constant(0))
    empty = opset13.concat([batch, opset13.constant(np.array([kv_heads, 0, width], dtype=np.int64))], axis=0)
    for op in ir.get_ops():
        if op.get_type_name() == "ReadValue":  # each state starts as an empty cache of the batch's size
            op.set_arguments([opset13.broadcast(opset13.constant(0.0, dtype=op.get_output_element_type(0)), empty)])
    ir.validate_nodes_and_infer_types()
    return ir


class _CacheAsTensors(torch.nn.Module):
    """The model with its KV cache as flat tensors in and out, so the trace sees the cache as inputs and outputs."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = flat_cache(self.model.config, past)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


def _save_tokenizer(tokenizer, folder: Path) -> None:
    from openvino_tokenizers import convert_tokenizer

    encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(encoder, folder / "openvino_tokenizer.xml")
    ov.save_model(decoder, folder / "openvino_detokenizer.xml")
    tokenizer.save_pretrained(folder)


def build(mode: str, ctx: EngineContext) -> OpenVinoEngine:
    own = ctx.options.get("openvino") or {}
    weights = str(own.get("weights") or DEFAULT_WEIGHTS)
    check_weights(weights, ctx.loaded.model.config)
    check_exportable(ctx.loaded.model.config, ctx.loaded.name)
    folder, draft = export(ctx.loaded, weights), None
    if mode == "draft":
        checkpoint = own.get("draft_checkpoint")
        if not checkpoint:
            raise SpecbenchError("eval.engines entry 'openvino:draft' needs a draft of the target's tokenizer: "
                                 "eval.engine_options.openvino.draft_checkpoint=PATH (a distilled draft artifact)")
        model = load_distilled_draft(with_dtype(ctx.loaded, "float32"), checkpoint)
        draft = (export(model, weights), f"{Path(checkpoint).name}:{weights}")
    return OpenVinoEngine(folder, weights, ctx.max_new_tokens, set(ctx.loaded.eos_token_ids), mode, ctx.threads,
                          ctx.options["lookup_tokens"], ctx.options["lookup_ngram"], draft,
                          ctx.options["draft_tokens"])
