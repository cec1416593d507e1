"""Classic speculative decoding with a separate draft model: a chain (tree=chain) or a tree (static, greedy, dynamic,
llmcad).

The draft is any same-tokenizer model or an early-exit view of the target; a model of another tokenizer drafts a
chain through text (translate=true, specbench.drafters.universal), its tokenizer work timed in translate_time. It
keeps its own KV cache: each propose first feeds the committed tokens the cache lacks, then the tree policy grows
the draft level by level, each new level fed in one forward with a tree mask on top of the cache (nodes see the
committed prefix and their ancestors). After verification the cache keeps the committed prefix plus the accepted
nodes it already holds (a gather, as for the target), so the next propose only feeds the bonus token and the last
accepted one.

When sampling (temperature > 0) the children are drawn from q, the draft distribution after the same
temperature/top-p/top-k as the target, and q is recorded for rejection sampling; greedy drafting takes the top-k.
"""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import DynamicCache

from specbench.sampling import SamplingParams
from specbench.drafters.base import DrafterCost, DecodeState, Drafter, StepOutcome
from specbench.drafters.universal import UniversalDraft
from specbench.errors import SpecbenchError
from specbench.execution.backends import RUN_KEYS
from specbench.models.distilled_draft import load_distilled_draft
from specbench.models.early_exit import early_exit
from specbench.models.shape import ModelShape
from specbench.models.loading import LoadedModel
from specbench.trees.chain import ChainPolicy
from specbench.trees.policy import GrowingTree, TreePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import cache_bytes, commit_path


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft tokens are verified as target tokens: the two must map every token id to the same string."""
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise SpecbenchError(
            f"draft model '{draft.name}' has a different tokenizer from target '{target.name}' "
            f"({len(draft.tokenizer)} vs {len(target.tokenizer)} tokens, or the same ids mean different strings); "
            f"draft through text with method.draft.translate=true, pick a draft of the same family or use "
            f"method.draft.early_exit_layers=N")
    draft_v, target_v = draft.model.config.vocab_size, target.model.config.vocab_size
    if draft_v != target_v:
        raise SpecbenchError(f"draft model '{draft.name}' outputs {draft_v} logits per token but target "
                             f"'{target.name}' outputs {target_v}; the vocabularies must have the same size "
                             f"(or draft through text with method.draft.translate=true)")


def same_vocabulary(target: LoadedModel, draft: LoadedModel) -> bool:
    try:
        check_same_vocabulary(target, draft)
    except SpecbenchError:
        return False
    return True


class DraftModelDrafter(Drafter):
    name = "draft_model"
    tree_policies = ("chain", "dynamic", "static", "greedy", "hardware_aware", "llmcad")

    def __init__(self, target: LoadedModel, tree: TreePolicy, draft_model: LoadedModel | DictConfig | None = None,
                 early_exit_layers: int | None = None, checkpoint: str | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, translate: bool = False) -> None:
        """The draft is, first match wins: a distilled artifact (checkpoint), else exactly one of a model-group
        entry (draft_model) and the target's first early_exit_layers layers. translate: a draft of another tokenizer
        proposes a greedy chain through text (tree=chain) instead of being refused."""
        if checkpoint is not None and draft_model is not None:
            raise SpecbenchError(f"method={self.name} got two drafts: method.checkpoint (a distilled draft) and "
                                 f"method.draft.model; set one of them to null")
        if checkpoint is None and (draft_model is None) == (early_exit_layers is None):
            raise SpecbenchError(f"method={self.name} needs exactly one draft: method.draft.early_exit_layers=N (the "
                                 f"target's first N layers), a model-group entry in method.draft.model (then set "
                                 f"method.draft.early_exit_layers=null) or a distilled draft in method.checkpoint")
        if isinstance(draft_model, DictConfig):  # a model-group node: load it like the target (the run's backend
            # is applied to it by evaluation.methods.build_drafter, so its RUN_KEYS are no loader arguments)
            loader = OmegaConf.masked_copy(draft_model, [k for k in draft_model if k not in RUN_KEYS])
            draft_model = instantiate(loader, dtype=str(target.model.dtype).removeprefix("torch."),
                                      device=str(target.model.device))
        if checkpoint is not None:
            self.draft = load_distilled_draft(target, checkpoint)
        else:
            self.draft = early_exit(target, early_exit_layers) if draft_model is None else draft_model
        self.universal = None
        if translate and not same_vocabulary(target, self.draft):
            if not isinstance(tree, ChainPolicy):
                raise SpecbenchError(f"draft '{self.draft.name}' has another tokenizer than target '{target.name}': "
                                     f"it drafts one chain through text, so use tree=chain (tree.budget - 1 tokens), "
                                     f"not tree={tree.name}")
            self.universal = UniversalDraft(target, self.draft)
        else:
            check_same_vocabulary(target, self.draft)
        self._target_param_ids = {id(p) for p in target.model.parameters()}
        self.tree, self.sampling, self.seed = tree, SamplingParams(temperature, top_p, top_k), seed
        self.generator: torch.Generator | None = None  # policies sample children when this is set
        self.cache = DynamicCache()

    def cost(self) -> DrafterCost:
        """The draft's forwards: one per level drafted (metrics counts them from the records' tree depths)."""
        return DrafterCost(draft=ModelShape.of(self.draft.model))

    def on_backend(self, run_on) -> None:
        self.draft = run_on(self.draft)

    def reset(self, state: DecodeState) -> None:
        self.cache = DynamicCache()
        self.generator = None if self.sampling.greedy else torch.Generator().manual_seed(self.seed)
        self.tree.reset()
        if self.universal is not None:
            self.universal.reset()

    @property
    def translate_time(self) -> float:
        """Seconds of tokenizer work this prompt (a draft of another tokenizer); part of the draft time."""
        return 0.0 if self.universal is None else self.universal.translate_time

    def propose(self, state: DecodeState) -> TokenTree:
        if self.universal is not None:  # deterministic candidates: no draft distribution is recorded
            return TokenTree.chain(state.root, self.universal.propose(self.draft.model, state.tokens,
                                                                       self.tree.budget - 1))
        self._tokens = state.tokens
        self._slots: dict[int, int] = {}  # growing-tree node -> its position in the draft cache
        return self.tree.build(state.root, self)

    @torch.inference_mode()
    def expand(self, tree: GrowingTree, nodes: list[int]) -> torch.Tensor:
        """Feed the nodes the draft has not seen and return q after each (the DraftExpander contract)."""
        self._growing = tree
        model = self.draft.model
        if nodes == [0]:  # the root: catch up on the committed tokens, root last
            self._committed = len(self._tokens)
            missing = self._tokens[self.cache.get_seq_length():]
            out = model(input_ids=torch.tensor([missing], device=model.device), past_key_values=self.cache,
                        use_cache=True, logits_to_keep=1)  # the LM head only where a distribution is needed
            self._slots[0] = self._committed - 1
            return self._draft_probs(out.logits[0, -1:])
        past = self.cache.get_seq_length()
        mask = torch.zeros(len(nodes), past + len(nodes), dtype=torch.bool)
        mask[:, : self._committed] = True
        for row, node in enumerate(nodes):
            mask[row, past + row] = True
            ancestor = tree.parents[node]
            while ancestor > 0:
                mask[row, self._slots[ancestor] if ancestor in self._slots else past + nodes.index(ancestor)] = True
                ancestor = tree.parents[ancestor]
        positions = torch.tensor([self._committed - 1 + tree.depths[n] for n in nodes])
        out = model(input_ids=torch.tensor([[tree.tokens[n] for n in nodes]], device=model.device),
                    attention_mask=mask[None, None].to(model.device), position_ids=positions[None].to(model.device),
                    past_key_values=self.cache, use_cache=True)
        for row, node in enumerate(nodes):
            self._slots[node] = past + row
        return self._draft_probs(out.logits[0])

    def _draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """q when sampling; the plain softmax when greedy (only its ranking and log-probabilities are used)."""
        logits = logits.float().cpu()
        return logits.softmax(-1) if self.sampling.greedy else self.sampling.probs(logits)

    def observe(self, outcome: StepOutcome) -> None:
        """Keep the committed prefix plus the accepted nodes already in the draft cache; drop the rest."""
        if self.universal is not None:  # it re-synchronises its cache with the committed text at the next propose
            return
        kept, node = [], 0
        children: dict[int, dict[int, int]] = {}
        for child, parent in enumerate(self._growing.parents[1:], start=1):
            children.setdefault(parent, {})[self._growing.tokens[child]] = child
        for token in outcome.tree.tokens[outcome.path[1:]].tolist():
            node = children.get(node, {}).get(token)
            if node is None or node not in self._slots:
                break
            kept.append(self._slots[node] - self._committed)
        commit_path(self.cache, self._committed, kept)
        self.tree.observe(outcome.tree, outcome.path)

    def cache_bytes(self) -> int:
        return cache_bytes(self.cache if self.universal is None else self.universal.cache)

    def parameters_bytes(self) -> tuple[int, int]:
        """The draft's own weights: those it shares with the target (early exit, distilled embeddings) are free."""
        params = [p for p in self.draft.model.parameters() if id(p) not in self._target_param_ids]
        return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
