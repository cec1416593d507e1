"""llama.cpp (llama-cpp-python) on the model config's GGUF itself, the weights as shipped (e.g. Q4_1): plain greedy
decoding, its n-gram prompt lookup (LlamaPromptLookupDecoding) and a draft model of the target's vocabulary (a GGUF
of its own, eval.engine_options.llama_cpp.draft, or the project's distilled draft written as one, draft_checkpoint).

Each prompt starts from an empty KV cache (llama-cpp-python would reuse a prompt prefix it still holds; our decoder
never does). A step is one `eval` call (one batched forward of the last token plus the drafts). Some native builds
crash in the batched matmul for n_batch > 1 (a segfault would take the whole run down), so the engine is first probed
in a subprocess: a crash there falls back to n_batch=1 (serial prefill, logged and recorded), or the row is left out
with the reason in one line.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

from specbench.decoding import Generation
from specbench.engines.base import Clock, Engine, EngineContext, EngineUnavailable
from specbench.errors import SpecbenchError
from specbench.models.distilled_draft import load_distilled_draft
from specbench.models.gguf_draft import draft_gguf
from specbench.models.loading import resolve_path, with_dtype

log = logging.getLogger(__name__)
PROBE = """
import sys, llama_cpp
path, n_batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog. " * 6)
for _, _t in zip(range(4), llm.generate(tokens, temp=0.0, top_k=1)):
    pass
"""


class _GreedyDraft(LlamaDraftModel):
    """A draft model for llama-cpp-python's speculative loop: the next `tokens` greedy tokens of another GGUF (its
    KV cache reused across calls for the common prefix)."""

    def __init__(self, llm: llama_cpp.Llama, tokens: int) -> None:
        self.llm, self.tokens = llm, tokens

    def __call__(self, input_ids, /, **kwargs):
        out = [t for _, t in zip(range(self.tokens), self.llm.generate(input_ids.tolist(), temp=0.0, top_k=1))]
        return np.asarray(out, dtype=np.intc)


class LlamaCppEngine(Engine):
    name = "llama_cpp"

    def __init__(self, path: Path, max_new_tokens: int, eos: set[int], mode: str, threads: int, n_batch: int,
                 n_ctx: int, lookup_tokens: int, lookup_ngram: int, draft: Path | None, draft_tokens: int) -> None:
        self.path, self.max_new_tokens, self.eos, self.mode, self.threads = path, max_new_tokens, eos, mode, threads
        self.n_batch, self.options = n_batch, {}
        common = {"n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_batch, "n_threads": threads,
                  "n_threads_batch": threads, "verbose": False}
        speculative = None
        if mode == "prompt_lookup":
            speculative = LlamaPromptLookupDecoding(max_ngram_size=lookup_ngram, num_pred_tokens=lookup_tokens)
            self.options = {"lookup_tokens": lookup_tokens, "lookup_ngram": lookup_ngram}
        elif mode == "draft":
            speculative = _GreedyDraft(llama_cpp.Llama(model_path=str(draft), **common), draft_tokens)
            self.options = {"draft": f"{draft.name}:{file_type(speculative.llm)}", "draft_tokens": draft_tokens}
        self.llm = llama_cpp.Llama(model_path=str(path), draft_model=speculative, **common)
        self.weights = file_type(self.llm)

    def describe(self) -> dict:
        return {"version": llama_cpp.__version__, "weights": self.weights, "threads": self.threads,
                "n_batch": self.n_batch, **self.options}

    def generate(self, prompt_ids: list[int]) -> Generation:
        llm = self.llm
        if len(prompt_ids) + self.max_new_tokens > llm.n_ctx():
            raise SpecbenchError(f"a prompt of {len(prompt_ids)} tokens and eval.max_new_tokens={self.max_new_tokens} "
                                 f"pass llama_cpp's KV cache of {llm.n_ctx()} tokens: raise "
                                 f"eval.engine_options.llama_cpp.n_ctx")
        llm.reset()  # no prefix reuse from the previous prompt
        clock, tokens = Clock(), []
        real_eval = llm.eval
        llm.eval = lambda batch: (clock.forward(), real_eval(batch))[1]
        try:
            for token in llm.generate(prompt_ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
                clock.tokens(1)
                tokens.append(token)
                if token in self.eos or len(tokens) >= self.max_new_tokens:
                    break
        finally:
            del llm.eval
        return clock.generation(prompt_ids, tokens, self.max_new_tokens, self.eos)


def file_type(llm: llama_cpp.Llama) -> str:
    """The GGUF's weight format as llama.cpp names it (Q4_1, Q8_0, Q4_K_M)."""
    value = llm.metadata.get("general.file_type")
    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return f"file_type {value}"


@lru_cache(maxsize=8)
def probe(path: str, n_batch: int, threads: int) -> str | None:
    """None when llama.cpp loads and decodes the GGUF with this n_batch in a subprocess, else why not (one line)."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, path, str(n_batch), str(threads)], capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "it did not decode 4 tokens in 300 s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"it died of {signal.Signals(-done.returncode).name}"
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return f"it failed: {lines[-1] if lines else f'exit status {done.returncode}'}"


def gguf_path(model_path: str, what: str = "the model config's path") -> Path:
    resolved = resolve_path(model_path)
    if not isinstance(resolved, Path) or resolved.suffix != ".gguf" or not resolved.is_file():
        raise SpecbenchError(f"llama_cpp decodes a GGUF file; {what} is '{model_path}': give a model whose path is a "
                             f".gguf, or drop llama_cpp from eval.engines")
    return resolved


def build(mode: str, ctx: EngineContext) -> LlamaCppEngine:
    opts, own = ctx.options, ctx.options.get("llama_cpp") or {}
    path = gguf_path(ctx.model_path)
    draft = None
    if mode == "draft":
        if own.get("draft"):
            draft = gguf_path(own["draft"], "eval.engine_options.llama_cpp.draft")
        elif own.get("draft_checkpoint"):  # the project's distilled draft, written as a GGUF of the target's
            draft = draft_gguf(path, load_distilled_draft(with_dtype(ctx.loaded, "float32"), own["draft_checkpoint"]))
        else:
            raise SpecbenchError("eval.engines entry 'llama_cpp:draft' needs a draft of the target's vocabulary: "
                                 "eval.engine_options.llama_cpp.draft=PATH (a GGUF) or draft_checkpoint=PATH (a "
                                 "distilled draft artifact)")
    n_batch = int(own.get("n_batch", 512))
    why = probe(str(path), n_batch, ctx.threads)
    if why and n_batch > 1:
        log.warning("llama_cpp with n_batch=%d: %s in a probe; this build runs it with n_batch=1 (serial prefill)",
                    n_batch, why)
        n_batch, why = 1, probe(str(path), 1, ctx.threads)
    if why:
        raise EngineUnavailable(f"llama.cpp {llama_cpp.__version__} cannot decode {path.name} here: {why} in a probe "
                                f"subprocess, even with n_batch=1")
    eos = set(ctx.loaded.eos_token_ids)
    return LlamaCppEngine(path, ctx.max_new_tokens, eos, mode, ctx.threads, n_batch, int(own.get("n_ctx", 2048)),
                          opts["lookup_tokens"], opts["lookup_ngram"], draft, opts["draft_tokens"])
