"""EAGLE (Li et al. 2024; EAGLE-2's dynamic tree, EAGLE-3's fused features): a one-layer drafter over the target's
own hidden features.

Draft row t reads the target's feature at position t (EAGLE-3: the low, mid and high layers' states fused by a
linear k*d -> d; EAGLE-1: the last layer's) and the embedding of token t+1, mixes them with a linear 2d -> d, runs
ONE decoder layer of the target's own architecture (transformers' class, the target's config with one layer) and its
final norm, and predicts token t+2 through a draft LM head. Deeper draft rows read the drafter's own output feature
at their parent instead of the target's (what EAGLE-3's training-time test trains for).

The draft LM head covers draft_vocab tokens only (EAGLE-3's d2t map, FR-Spec): on a 135M target the full head is a
fifth of the parameters. `d2t` maps a draft id to its target id; the draft distribution is zero elsewhere, which
rejection sampling corrects like any other draft.

Like the draft model, the drafter keeps its own KV cache: one row per committed position, fed with the target's
features that the verify forward exposes (`needs_hidden_states` names the hidden-state indices). Tree rows sit on
top of it with a tree mask and are dropped after verification: the accepted ones are fed again with the target's
features, which replace the drafter's guesses.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import torch
from torch import nn
from transformers import AutoModel, DynamicCache

from specbench.drafters.base import DecodeState, Drafter, StepOutcome
from specbench.errors import SpecbenchError
from specbench.models.published import load_drafter_checkpoint, published_eagle_head
from specbench.execution.backends import supported, with_backend
from specbench.execution.openvino import OpenVinoEagleHead
from specbench.models.loading import LoadedModel
from specbench.sampling import SamplingParams
from specbench.timing import StepTimer
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.policy import GrowingTree, TreePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import cache_bytes, commit_path

def feature_layers(num_layers: int, features: str) -> tuple[int, ...]:
    """Hidden-state indices the drafter reads (0: the embeddings, i: after layer i, -1: the final normed state):
    EAGLE-3's low, mid and high layers (its choice for Llama: 2, L/2, L-3) or EAGLE-1's last feature."""
    if features == "fused":
        return min(2, num_layers), num_layers // 2, max(num_layers - 3, 1)
    if features == "last":
        return (-1,)
    raise SpecbenchError(f"method.features={features!r} is invalid: use fused (EAGLE-3's low, mid and high layers) "
                         f"or last (EAGLE-1's last-layer feature)")


def check_draft_vocab(draft_vocab, vocab: int) -> None:
    if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= vocab:
        raise SpecbenchError(f"method.draft_vocab={draft_vocab!r} is invalid: give an integer in 1..{vocab} (the "
                             f"target's vocabulary) or null for all of it")


class EagleHead(nn.Module):
    """fuse -> fc([feature, next-token embedding]) -> one target-architecture decoder layer + norm -> draft LM head."""

    def __init__(self, config, layers: tuple[int, ...], draft_vocab: int) -> None:
        super().__init__()
        d = config.hidden_size
        check_draft_vocab(draft_vocab, config.vocab_size)
        self.layers = tuple(layers)
        self.fuse = nn.Linear(len(layers) * d, d, bias=False) if len(layers) > 1 else nn.Identity()
        self.fc = nn.Linear(2 * d, d, bias=False)
        body = copy.deepcopy(config)
        body.num_hidden_layers, body.vocab_size, body.pad_token_id = 1, 1, None
        self.body = AutoModel.from_config(body)
        self.body.embed_tokens = None  # the body takes fc's output as inputs_embeds, never token ids
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.arange(draft_vocab))  # draft id -> target id

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, **body_kwargs) -> torch.Tensor:
        """The output feature of each row (after the body's norm); features are fused ones or the drafter's own."""
        x = self.fc(torch.cat([features, embeds.to(features.dtype)], dim=-1))
        return self.body(inputs_embeds=x, use_cache=True, **body_kwargs).last_hidden_state


def load_eagle_head(target: LoadedModel, checkpoint: str | None) -> tuple[EagleHead, dict]:
    """The artifact's head for target (on its device and dtype) and the artifact's metadata."""
    meta, tensors = load_drafter_checkpoint(checkpoint, "eagle", target)
    arch = meta["arch"]
    if arch.get("layout"):  # SafeAILab's EAGLE / EAGLE-3 architecture, as published
        return published_eagle_head(target, meta, tensors), meta
    head = EagleHead(target.model.config, tuple(arch["feature_layers"]), arch["draft_vocab"])
    try:
        head.load_state_dict(tensors)
    except RuntimeError as exc:
        raise SpecbenchError(f"checkpoint '{checkpoint}' does not hold the EAGLE head its JSON describes "
                             f"({str(exc).splitlines()[0]})") from exc
    return head.to(device=target.model.device, dtype=target.model.dtype).eval(), meta


def check_d2t(d2t: torch.Tensor, vocab: int, checkpoint) -> torch.Tensor:
    """The draft-to-target id map, checked: every id a distinct target token in 0..vocab-1. A negative id would index
    from the end and a repeated one overwrite another's probability, drafting silently wrong tokens."""
    if d2t.ndim != 1 or not len(d2t) or d2t.is_floating_point():
        raise SpecbenchError(f"checkpoint '{checkpoint}': its draft-to-target map d2t is a {d2t.dtype} tensor of shape "
                             f"{tuple(d2t.shape)}; it must list one integer target id per draft token")
    low, high, distinct = int(d2t.min()), int(d2t.max()), len(torch.unique(d2t))
    if low < 0 or high >= vocab or distinct != len(d2t):
        raise SpecbenchError(f"checkpoint '{checkpoint}': its d2t map sends its {len(d2t)} draft ids to target ids "
                             f"{low}..{high} ({distinct} distinct); each must be a distinct id in 0..{vocab - 1} (the "
                             f"target's vocabulary)")
    return d2t.long()


# draft_ms's measurement: rows per expand, the context of its draft cache, the timed repeats, the root's rows
LEVEL_ROWS, COST_CONTEXT, COST_REPEATS, ROOT_ROWS = (1, 2, 4, 8, 16, 32, 64), 192, 5, 3


class EagleDrafter(Drafter):
    """tree=dynamic (EAGLE-2) by default; chain and static too. tree=greedy or tree=hardware_aware without
    tree.accept_prob take the artifact's held-out per-position rank accuracies, as Medusa's do."""

    name = "eagle"
    tree_policies = ("dynamic", "chain", "static", "greedy", "hardware_aware")
    needs_hidden_states = True  # replaced per artifact by the hidden-state indices its features come from

    def __init__(self, target: LoadedModel, tree: TreePolicy, checkpoint: str | None = None,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> None:
        self.head, meta = load_eagle_head(target, checkpoint)
        self.needs_hidden_states = self.head.layers
        self.embed = target.model.get_input_embeddings()
        self.vocab_size, self.hidden_size = target.model.config.vocab_size, target.model.config.hidden_size
        self.d2t = check_d2t(self.head.d2t.cpu(), self.vocab_size, checkpoint)
        if isinstance(tree, GreedyPolicy):
            accuracy = meta["metrics"].get("rank_accuracy")  # a published checkpoint carries none
            if accuracy is None and tree.accept_table is None:
                raise SpecbenchError(f"checkpoint '{checkpoint}' carries no per-position accuracies for "
                                     f"tree={tree.name}: give tree.accept_prob (a calibration JSON or a preset) or use "
                                     f"tree=dynamic (EAGLE-2's, the default)")
            tree = tree.with_accept_prob(accuracy)
        self.tree, self.sampling, self.seed = tree, SamplingParams(temperature, top_p, top_k), seed
        self.generator: torch.Generator | None = None  # policies sample children when this is set
        self.cache = DynamicCache()

    def on_openvino(self) -> None:
        """The whole head, its draft LM head included, as one OpenVINO call per tree level (execution/openvino/
        draft_head.py says why)."""
        self.head = OpenVinoEagleHead(self.head)
        self._level_ms = None  # draft_ms measures the head that drafts

    def on_backend(self, run_on) -> None:
        """The head runs on the run's backend, as the target does: eager bf16 linears repack their weights on every
        call (the default dynamic tree drafted in 16.8 ms eager, 11.3 prepacked: experiments/eagle/draft_cost.py).
        Under an eager run (an int4 target's, whose own linears are int4 kernels) the head's float linears would
        repack too, so where oneDNN packs their dtype both are timed here and the faster one drafts."""
        head = LoadedModel("eagle-head", self.head, tokenizer=None, source="the drafter's head")
        ran = run_on(head)
        weight = self.head.fc.weight
        if ran.backend != "eager" or supported("prepacked", weight.dtype, weight.device) is not None:
            self.head = ran.model
            return
        heads, caches = (ran.model, with_backend(head, "prepacked").model), []
        for model in heads:
            self.head = model  # the timing helpers read self.head
            caches.append(self._cost_cache())
        best = [float("inf")] * len(heads)
        for _ in range(COST_REPEATS):  # alternating, each keeping its fastest round: this VM's timings drift
            for i, model in enumerate(heads):
                self.head = model
                best[i] = min(best[i], self._expand_once_ms(caches[i], ROOT_ROWS))
        self.head = heads[best.index(min(best))]
        self._level_ms = None  # draft_ms measures the head that drafts

    def compile_ahead(self, shortest: int, longest: int) -> None:
        """The OpenVINO head's static models for the draft cache's sizes, which follow the target's context."""
        if isinstance(self.head, OpenVinoEagleHead):
            self.head.compile_ahead(shortest, longest)

    def prefill_extras(self, prompt: TokenTree) -> tuple[torch.Tensor, torch.Tensor]:
        """No extra rows, but an (empty) answer: the drafter then observes the prefill, which hands it the target's
        features at every prompt position (Drafter.prefill_extras)."""
        model = self.embed.weight
        return torch.zeros(0, model.shape[1], dtype=model.dtype, device=model.device), torch.zeros(0, dtype=torch.long)

    def reset(self, state: DecodeState) -> None:
        self.cache = DynamicCache()
        self._committed = 0  # cache rows: one per committed position t, fed (feature at t, token t+1)
        self._pending = state.last.hidden, [state.root]  # replaced by the whole prompt when the prefill is observed
        self.generator = None if self.sampling.greedy else torch.Generator().manual_seed(self.seed)
        self.tree.reset()

    def propose(self, state: DecodeState) -> TokenTree:
        self._slots: dict[int, int] = {}  # growing-tree node -> its row in the draft cache
        self._features: dict[int, torch.Tensor] = {}  # node -> the drafter's output feature there
        return self.tree.build(state.root, self)

    @torch.inference_mode()
    def expand(self, tree: GrowingTree, nodes: list[int]) -> torch.Tensor:
        """q after each node (the DraftExpander contract). The root first feeds the committed positions the cache
        lacks (the root's own row, target feature and root token, is the last of them)."""
        if nodes == [0]:
            features, tokens = self._pending
            out, logits = self._draft_committed(features[None], self._embed(tokens))
            self._committed = self.cache.get_seq_length()
            self._features[0] = out[0, -1]
            return self._draft_probs(logits[0, -1:])
        past = self.cache.get_seq_length()
        mask = torch.zeros(len(nodes), past + len(nodes), dtype=torch.bool)
        mask[:, : self._committed] = True
        for row, node in enumerate(nodes):
            mask[row, past + row] = True
            ancestor = tree.parents[node]
            while ancestor > 0:  # a level's parents were all expanded by earlier calls: their rows are cached
                mask[row, self._slots[ancestor]] = True
                ancestor = tree.parents[ancestor]
        device = self.embed.weight.device
        positions = torch.tensor([self._committed - 1 + tree.depths[n] for n in nodes], device=device)
        parents = torch.stack([self._features[tree.parents[n]] for n in nodes])
        out, logits = self._draft(parents[None], self._embed([tree.tokens[n] for n in nodes]),
                                  attention_mask=mask[None, None].to(device), position_ids=positions[None],
                                  past_key_values=self.cache)
        for row, node in enumerate(nodes):
            self._slots[node], self._features[node] = past + row, out[0, row]
        return self._draft_probs(logits[0])

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        return self.embed(torch.tensor([tokens], device=self.embed.weight.device))

    def _draft_committed(self, features: torch.Tensor, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """_draft over committed rows, from the target's features: fused by the head (on OpenVINO in the same call)."""
        if isinstance(self.head, OpenVinoEagleHead):
            return self.head.draft(features, embeds, past_key_values=self.cache, committed=True)
        return self._draft(self.head.fuse(features.to(self.head.fc.weight.dtype)), embeds, past_key_values=self.cache)

    def _draft(self, features: torch.Tensor, embeds: torch.Tensor, **body_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's output feature and draft logits: one call on OpenVINO (OpenVinoEagleHead computes both), else
        the head's forward, then its LM head."""
        if isinstance(self.head, OpenVinoEagleHead):
            return self.head.draft(features, embeds, **body_kwargs)
        out = self.head(features, embeds, **body_kwargs)
        return out, self.head.lm_head(out)

    def _draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) over the target's vocabulary: q when sampling, the plain softmax when greedy, on the draft ids."""
        logits = logits.float().cpu()
        q = logits.softmax(-1) if self.sampling.greedy else self.sampling.probs(logits)
        probs = torch.zeros(len(q), self.vocab_size)
        probs[:, self.d2t] = q
        return probs

    def observe(self, outcome: StepOutcome) -> None:
        """Drop the tree rows (fed with the drafter's own features) and queue the accepted path with the target's."""
        commit_path(self.cache, self._committed, [])
        tokens = outcome.tree.tokens[outcome.path[1:]].tolist() + [outcome.next_token]
        self._pending = outcome.verify.hidden[outcome.path], tokens
        self.tree.observe(outcome.tree, outcome.path)

    def draft_ms(self, choices: list[list[int]]) -> float:
        """ms of drafting a static tree of these paths here: the root's forward over the accepted path (~3 rows),
        then one forward per deeper level over the nodes expanded there."""
        levels = Counter(len(parent) for parent in {tuple(p[:-1]) for p in choices})  # depth -> expanded nodes
        return self._expand_ms(ROOT_ROWS) + sum(self._expand_ms(n) for depth, n in levels.items() if depth > 0)

    @torch.inference_mode()
    def _expand_ms(self, rows: float) -> float:
        """One expand over `rows` nodes on a draft cache of COST_CONTEXT rows (head forward, draft probabilities,
        top-k), measured once per drafter at LEVEL_ROWS (the median of COST_REPEATS after a warm-up) and
        interpolated."""
        if getattr(self, "_level_ms", None) is None:
            cache = self._cost_cache()
            self._level_ms = [float(np.median([self._expand_once_ms(cache, n) for _ in range(COST_REPEATS + 1)][1:]))
                              for n in LEVEL_ROWS]
        return float(np.interp(rows, LEVEL_ROWS, self._level_ms))

    @torch.inference_mode()
    def _cost_cache(self) -> DynamicCache:
        """The head's draft cache over COST_CONTEXT rows, the context its expands are timed on."""
        cache = DynamicCache()  # the head reads fused features: the target's hidden size wide (EAGLE-3's fc is 3d)
        device, dtype = self.embed.weight.device, self.head.fc.weight.dtype
        self._draft(torch.zeros(1, COST_CONTEXT, self.hidden_size, device=device, dtype=dtype),
                    self._embed([0] * COST_CONTEXT), past_key_values=cache)
        return cache

    @torch.inference_mode()
    def _expand_once_ms(self, cache: DynamicCache, n: int) -> float:
        """ms of one expand of the head over n rows after `cache`, which is cropped back afterwards."""
        device, dtype = self.embed.weight.device, self.head.fc.weight.dtype
        mask = torch.ones(1, 1, n, COST_CONTEXT + n, dtype=torch.bool, device=device)
        positions = torch.full((1, n), COST_CONTEXT, device=device)
        timer = StepTimer(device)  # on a GPU a host clock alone reads only the launches (timing.py)
        start = timer.mark()
        _, logits = self._draft(torch.zeros(1, n, self.hidden_size, device=device, dtype=dtype), self._embed([0] * n),
                                attention_mask=mask, position_ids=positions, past_key_values=cache)
        self._draft_probs(logits[0]).topk(4)
        end = timer.mark()
        timer.sync()
        commit_path(cache, COST_CONTEXT, [])
        return 1e3 * timer.seconds(start, end)

    def cache_bytes(self) -> int:
        return cache_bytes(self.cache)

    def parameters_bytes(self) -> tuple[int, int]:
        """The head's own weights (the token embedding is the target's)."""
        params = list(self.head.parameters())
        return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
