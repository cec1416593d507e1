"""What an engine row is: an engine users would deploy instead (llama.cpp, OpenVINO GenAI, transformers' generate),
decoding the run's prompt ids itself, greedy, to the run's token budget, timed like a method (prefill apart, one step
per target forward), so its records read like any method's.

An engine has the Decoder's interface (max_new_tokens, generate(prompt_ids) -> Generation) and says what it is
(`describe`: version, weight format, threads, its options), which becomes its settings and its records' columns.
"""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from specbench.decoding import Generation, StepRecord
from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel
from specbench.sampling import SamplingParams

INSTALL = "pip install -e '.[engines]'"


class EngineUnavailable(Exception):
    """This engine cannot run on this machine (a native build that crashes): its row is left out and the reason
    logged in one line, the rest of the run goes on."""


@dataclass
class EngineContext:
    """What an engine is built from: the run's target as its fastest plain decoding runs it (eager, that dtype and
    those weights), the target as loaded, the model config's path (a GGUF an engine may load itself) and eval.engine_options.

    `target` is made on first read (`make_target`): only transformers' engine decodes it, the runtimes build from
    `loaded`, and making it quantises the whole model (seconds), in weights an own-graph route may hold that the eager
    kernels cannot (int4 in groups of 128 over 576 channels: the builder pads a block, aten's packing does not)."""

    make_target: Callable[[], LoadedModel]
    loaded: LoadedModel  # the target as loaded (eager, full-precision weights): what a draft is derived from
    model_path: str
    max_new_tokens: int
    options: dict
    threads: int  # eval.engine_options.threads, else torch's

    @functools.cached_property
    def target(self) -> LoadedModel:
        return self.make_target()


class Engine(ABC):
    name: str  # the engine (llama_cpp, openvino, transformers)
    mode: str  # plain, or one of its own speculative modes
    max_new_tokens: int
    eos: set[int]

    @abstractmethod
    def describe(self) -> dict:
        """{version, weights, threads, ...}: what decides its tokens and speed, kept in settings and records."""

    @abstractmethod
    def generate(self, prompt_ids: list[int]) -> Generation:
        ...


class Clock:
    """The times an engine reaches each target forward and emits tokens: a forward's step ends when the next one
    starts, and gains the tokens emitted in between (the first token is prefill's)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.events: list[tuple[str, float, int]] = []

    def forward(self) -> None:
        self.events.append(("forward", time.perf_counter(), 0))

    def tokens(self, n: int = 1) -> None:
        self.events.append(("tokens", time.perf_counter(), n))

    def generation(self, prompt_ids: list[int], tokens: list[int], max_new_tokens: int, eos: set[int]) -> Generation:
        """tokens cut at the first EOS (kept) and at max_new_tokens, as our Decoder cuts them; steps past the cut
        are dropped. Without forward events (an engine that only streams tokens) each token event is one forward."""
        end = time.perf_counter()
        tokens = list(tokens[:max_new_tokens])
        tokens = tokens[:next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))]
        first = next((i for i, (kind, _, n) in enumerate(self.events) if kind == "tokens" and n), None)
        if first is None or not tokens:
            return Generation(len(prompt_ids), tokens, prefill_time=end - self.start, wall_time=end - self.start)
        prefill_end = self.events[first][1]
        counted = any(kind == "forward" for kind, _, _ in self.events)
        gains: list[list] = []  # [time of the step's last token, tokens gained]
        for kind, t, n in self.events[first + 1:]:
            if kind == "forward" or not counted:
                gains.append([t, 0])
            if kind == "tokens" and gains:
                gains[-1] = [t, gains[-1][1] + n]
        steps, left, last = [], len(tokens) - 1, prefill_end
        for stamp, n in (g for g in gains if g[1]):
            if left <= 0:
                break
            n = min(n, left)
            left -= n
            steps.append(StepRecord(n, n - 1, n - 1, draft_time=0.0, verify_time=stamp - last, step_time=stamp - last,
                                    tried_deeper=False))
            last = stamp
        return Generation(len(prompt_ids), tokens, prefill_time=prefill_end - self.start, wall_time=end - self.start,
                          steps=steps)


def check_greedy(sampling: SamplingParams, what: str = "eval.engines") -> None:
    if sampling.temperature != 0:
        raise SpecbenchError(f"{what} compares greedy decoding; sampling.temperature={sampling.temperature} would "
                             f"need the engine to match our sampler draw for draw: use 0")
