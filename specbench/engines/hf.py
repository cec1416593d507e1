"""transformers' own `generate`, the engine every user of the library has: plain greedy decoding (eval.hf_generate,
or eval.engines=[transformers]) and its speculative modes, prompt lookup, an assistant model of the target's
tokenizer, and universal assisted decoding (an assistant of another tokenizer, through text).

It runs on the eager model in the dtype and weights of the run's fastest plain decoding. A step is one target
forward (a hook counts them), the tokens it gains are what generate streams after it.
"""

from __future__ import annotations

import torch
import transformers
from hydra.utils import instantiate
from transformers.generation.streamers import BaseStreamer

from specbench.decoding import Generation
from specbench.engines.base import Clock, Engine, EngineContext
from specbench.errors import SpecbenchError
from specbench.execution.backends import RUN_KEYS
from specbench.models.artifact import resolve_checkpoint
from specbench.models.distilled_draft import load_distilled_draft
from specbench.models.early_exit import early_exit
from specbench.models.loading import LoadedModel, with_dtype
from specbench.names import PLAIN

class _Stream(BaseStreamer):
    """generate() hands the streamer the prompt, then the tokens of each step."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.prompt_seen = clock, False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.clock.tokens(int(value.numel()))
        self.prompt_seen = True

    def end(self) -> None:
        pass


class TransformersEngine(Engine):
    name = "transformers"

    def __init__(self, target: LoadedModel, max_new_tokens: int, mode: str = PLAIN,
                 assistant: LoadedModel | None = None, lookup_tokens: int = 10, lookup_ngram: int = 2,
                 draft_tokens: int = 4) -> None:
        self.target, self.mode, self.max_new_tokens, self.assistant = target, mode, max_new_tokens, assistant
        self.eos = set(target.eos_token_ids)
        tok = target.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
        self.options = {}
        if mode == "prompt_lookup":
            self.options = {"prompt_lookup_num_tokens": lookup_tokens, "max_matching_ngram_size": lookup_ngram}
        elif mode in ("assistant", "universal"):
            assistant.model.generation_config.num_assistant_tokens = draft_tokens
            assistant.model.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.model.generation_config.assistant_confidence_threshold = 0.0
            self.options = {"assistant_model": assistant.model}
            if mode == "universal":
                self.options |= {"tokenizer": tok, "assistant_tokenizer": assistant.tokenizer}
        self.draft_tokens = draft_tokens

    def describe(self) -> dict:
        model = self.target.model
        out = {"version": transformers.__version__, "weights": self.target.weights,
               "dtype": str(model.dtype).removeprefix("torch."), "threads": torch.get_num_threads()}
        if "prompt_lookup_num_tokens" in self.options:
            out |= {"lookup_tokens": self.options["prompt_lookup_num_tokens"],
                    "lookup_ngram": self.options["max_matching_ngram_size"]}
        if self.assistant is not None:
            out |= {"assistant": self.assistant.name, "draft_tokens": self.draft_tokens}
        return out

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int]) -> Generation:
        model = self.target.model
        clock = Clock()
        hook = model.register_forward_pre_hook(lambda *_: clock.forward())
        try:
            out = model.generate(torch.tensor([prompt_ids], device=model.device), do_sample=False,
                                 max_new_tokens=self.max_new_tokens, eos_token_id=sorted(self.eos),
                                 pad_token_id=self.pad, streamer=_Stream(clock), use_cache=True, temperature=None,
                                 top_p=None, top_k=None, **self.options)
        finally:
            hook.remove()
        return clock.generation(prompt_ids, out[0, len(prompt_ids):].tolist(), self.max_new_tokens, self.eos)


def check_options(mode: str, own: dict, limit: int | None = None) -> None:
    """What the assistant and universal modes need from eval.engine_options.transformers (own), said before any
    model loads: an assistant, given one way, its file there, no more of the target's layers than it has (`limit`,
    when known)."""
    if mode == "assistant":
        checkpoint, layers = own.get("assistant_checkpoint"), own.get("assistant_layers")
        if not checkpoint and layers is None:
            raise SpecbenchError("eval.engines entry 'transformers:assistant' needs an assistant: "
                                 "eval.engine_options.transformers.assistant_checkpoint=PATH (a distilled draft) or "
                                 "assistant_layers=N (the target's first N layers)")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
            raise SpecbenchError(f"eval.engine_options.transformers.assistant_layers={layers!r} is invalid: give a "
                                 f"whole number of the target's first layers, 1 or more")
        if layers is not None and limit is not None and layers > limit:
            raise SpecbenchError(f"eval.engine_options.transformers.assistant_layers={layers} is invalid: the target "
                                 f"has {limit} layers, so use 1..{limit}")
        if checkpoint and layers is not None:
            raise SpecbenchError(f"eval.engine_options.transformers gives both assistant_checkpoint={checkpoint!r} and "
                                 f"assistant_layers={layers}: give one")
        if checkpoint and not resolve_checkpoint(str(checkpoint)).exists():
            raise SpecbenchError(f"eval.engine_options.transformers.assistant_checkpoint={checkpoint!r} does not exist; "
                                 f"give the path of a distilled draft artifact")
    elif mode == "universal" and not own.get("universal"):
        raise SpecbenchError("eval.engines entry 'transformers:universal' needs an assistant of another tokenizer:"
                             " +model@eval.engine_options.transformers.universal=NAME (a model-group entry)")


def build(mode: str, ctx: EngineContext) -> TransformersEngine:
    """assistant: the distilled draft (eval.engine_options.transformers.assistant_checkpoint) or the target's first
    assistant_layers layers; universal: a model-group entry of another tokenizer
    (+model@eval.engine_options.transformers.universal=NAME)."""
    opts, own = ctx.options, ctx.options.get("transformers") or {}
    check_options(mode, own, ctx.target.model.config.num_hidden_layers)
    assistant = None
    if mode == "assistant":
        assistant = _assistant(ctx, own.get("assistant_checkpoint"), own.get("assistant_layers"))
    elif mode == "universal":
        loader = {k: v for k, v in own["universal"].items() if k not in RUN_KEYS}
        assistant = instantiate(loader, dtype=str(ctx.target.model.dtype).removeprefix("torch."))
    return TransformersEngine(ctx.target, ctx.max_new_tokens, mode, assistant, opts["lookup_tokens"],
                              opts["lookup_ngram"], opts["draft_tokens"])


def _assistant(ctx: EngineContext, checkpoint: str | None, layers: int | None) -> LoadedModel:
    """Derived from the full-precision target in the engine's dtype (a distilled draft's layers are float weights;
    a quantised target's linears would not take them)."""
    target = ctx.target if ctx.target.weights == "fp" \
        else with_dtype(ctx.loaded, str(ctx.target.model.dtype).removeprefix("torch."))
    if checkpoint:
        return load_distilled_draft(target, checkpoint)
    return early_exit(target, layers)
