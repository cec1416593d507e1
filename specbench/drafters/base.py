"""The drafter contract (vLLM's 'proposer' role) and the state the decoder shares with it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch

from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel
from specbench.models.shape import ModelShape
from specbench.trees.token_tree import TokenTree
from specbench.verification.tree_forward import VerifyOutput


class TreeTooDeep(SpecbenchError):
    """A tree deeper than the drafter drafts (Medusa: one head per depth); deepest: the depth it can."""

    def __init__(self, message: str, deepest: int) -> None:
        super().__init__(message)
        self.deepest = deepest


@dataclass(frozen=True)
class DrafterCost:
    """The drafter's own work per step. Medusa: heads on the verified rows; draft model: sequential forwards of a
    smaller model; PPD: prompt-token rows appended to the target's forward (priced as extra rows)."""

    medusa_heads: int = 0  # each: a ResBlock (h x h) and an LM-head projection (h x vocab), read per step
    draft: ModelShape | None = None
    draft_forwards: int = 0
    prompt_tokens: int = 0


@dataclass
class DecodeState:
    tokens: list[int]  # prompt + generated tokens; the last one is the tree root, not yet in the target's cache
    prompt_len: int
    last: VerifyOutput | None = None  # target outputs on the committed path of the previous forward (prefill first)

    @property
    def root(self) -> int:
        return self.tokens[-1]


@dataclass
class StepOutcome:
    tree: TokenTree
    path: list[int]
    next_token: int
    verify: VerifyOutput  # full-tree outputs of this step's forward


class Drafter(ABC):
    """Every drafter is built as cls(target=LoadedModel, tree=TreePolicy, **its config): one constructor contract,
    so the evaluator needs no signature inspection. tree_policies names the tree configs it accepts; a method that
    shapes its own tree accepts only "native" and reads tree.budget."""

    name: str = "drafter"
    tree_policies: tuple[str, ...] = ("native",)
    needs_hidden_states: bool = False  # ask verification for last hidden states (Medusa/PPD draft from them)
    # proposes from state.tokens alone (no target outputs; observe learns nothing), so task=replay can replay it
    drafts_from_tokens: bool = False
    # keeps what it met in earlier answers (suffix decoding's global tree), so the evaluator has it forget its untimed
    # generations and, resuming a run folder, learn the folder's answers first (Evaluator._relearn)
    learns_across_answers: bool = False

    @classmethod
    def check_config(cls, config: dict) -> None:
        """Refuse bad knobs before any model loads: config is method.drafter's keys over the constructor's defaults
        (specbench.schema calls this; what needs the target or a checkpoint is checked when the drafter is built)."""

    def reset(self, state: DecodeState) -> None:
        """Called once per prompt after prefill; state.last holds the prefill outputs at the last prompt token."""

    def forget(self) -> None:
        """Drop what earlier answers taught it (learns_across_answers): as built, before any answer."""

    @abstractmethod
    def propose(self, state: DecodeState) -> TokenTree:
        """The tree to verify next, rooted at state.root."""

    def observe(self, outcome: StepOutcome) -> None:
        """Called after every accepted step (adaptive drafters update themselves here)."""

    def verify_extras(self, tree: TokenTree) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Optional non-vocabulary inputs to attach to the tree in the verify forward: (embeds, parent node ids)."""
        return None

    def prefill_extras(self, prompt: TokenTree) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Optional extras for the prefill forward (the prompt as a chain tree), as verify_extras gives for a step;
        a drafter that returns some then observes the prefill as a step whose path is the whole prompt, so its
        first step already has what the extras drafted (PPD's prompt-token guesses). Empty extras ask for the prefill
        alone: the drafter observes every prompt row's hidden states (EAGLE's features) but only the last row's
        logits: every row's would project the whole prompt onto the vocabulary, which nothing reads."""
        return None

    def cache_bytes(self) -> int:
        """Bytes of the drafter's own KV cache or state (a draft model's cache), for per-method memory."""
        return 0

    def parameters_bytes(self) -> tuple[int, int]:
        """(parameters, bytes) the drafter adds on top of the target; 0 for training-free drafters."""
        return 0, 0

    # What the evaluator asks of every drafter instead of looking inside it (docs/ARCHITECTURE.md: adding a drafter).

    def cost(self) -> DrafterCost:
        """The work one step adds to the target's forward, in the roofline's terms (projected_speedup, LLMCad's
        streaming projection); nothing for a lookup drafter."""
        return DrafterCost()

    def on_backend(self, run_on: Callable[[LoadedModel], LoadedModel]) -> None:
        """Run the models this drafter derived from the eager target (an early-exit draft, a tuned backbone) on the
        run's backend: `run_on` applies it. They are derived on eager because a compiled or prepacked forward cannot
        be sliced or LoRA-merged."""

    def on_openvino(self) -> None:
        """The run verifies on OpenVINO: run what this drafter computes every step there too (Medusa's tied LM head
        as an int8 OpenVinoLinear, EAGLE's whole head as one call per tree level). It only drafts, so the verify still
        decides every token; a drafter without such a module keeps this no-op."""

    def compile_ahead(self, shortest: int, longest: int) -> None:
        """Compile now what drafting for contexts of `shortest` to `longest` tokens would compile on the way (an
        OpenVINO head's static model per cache capacity), so no timed step holds a compile; most drafters compile
        nothing."""

    # ms one step of drafting a static tree of these paths (Medusa's choices) costs here, measured by the drafter
    # itself; None: not measured, and a hardware-aware tree then counts the target's L(n) alone
    draft_ms: Callable[[list[list[int]]], float] | None = None

    def fit(self, latency_ms: Callable[[float], float]) -> None:
        """Size the draft to this machine: L(n) is the ms of a target forward over n rows (measured here, or a
        board's roofline), plus the drafter's own draft_ms. A hardware-aware tree picks its budget from them; other
        trees ignore them."""
        tree = getattr(self, "tree", None)
        if hasattr(tree, "fit"):
            self.tree = tree.fit(latency_ms, self.draft_ms)

    @property
    def verifier(self) -> LoadedModel | None:
        """The model that verifies this drafter's tokens when it is not the run's target (a Medusa-2 artifact's tuned
        backbone): its own plain decoding is then the method's lossless reference."""
        return None
