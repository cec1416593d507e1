"""Parallel Prompt Decoding (Chen, PPD thesis 2024): m learned prompt-token embeddings guess tokens 2..m+1 ahead.

Every tree node carries a chain of its own prompt tokens (verify_extras), placed at the positions of the future
tokens they stand in for, so one target forward verifies this step's guesses and drafts the next step's; the last
prompt token carries them in the prefill (prefill_extras), so the first step has guesses too. The prompt tokens' KV
entries are never committed. The tree is the thesis's dynamic sparse tree: state T_k, used after
the accepted node carried k prompt tokens, has candidates up to depth k, and each candidate carries 1..m prompt
tokens, chosen offline from calibrated accuracies (specbench.drafters.ppd_tree).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from specbench.drafters.base import DecodeState, Drafter, StepOutcome
from specbench.drafters.ppd_tree import PPDState, dynamic_sparse_tree, hardware_aware_budget
from specbench.errors import SpecbenchError
from specbench.models.published import load_drafter_checkpoint
from specbench.trees.greedy import load_accept_prob
from specbench.trees.hardware_aware import HardwareAwarePolicy
from specbench.trees.policy import GrowingTree, TreePolicy
from specbench.trees.token_tree import TokenTree

log = logging.getLogger(__name__)


class PromptTokens(nn.Module):
    """(m, n_e, d) embeddings: prompt token k's n_e ensemble members (their logits are averaged)."""

    def __init__(self, num_prompt_tokens: int, num_ensemble: int, hidden_size: int,
                 init: torch.Tensor | None = None) -> None:
        super().__init__()
        if num_prompt_tokens < 1 or num_ensemble < 1:
            raise SpecbenchError(f"PPD needs num_prompt_tokens >= 1 and num_ensemble >= 1, got "
                                 f"{num_prompt_tokens} and {num_ensemble}")
        weight = torch.zeros(num_prompt_tokens, num_ensemble, hidden_size)
        if init is not None:  # text token embeddings, as the thesis initialises them
            weight.copy_(init.reshape(-1, hidden_size)[torch.arange(num_prompt_tokens * num_ensemble) % init.shape[0]]
                         .reshape(weight.shape))
        self.weight = nn.Parameter(weight)

    @property
    def num_prompt_tokens(self) -> int:
        return self.weight.shape[0]

    @property
    def num_ensemble(self) -> int:
        return self.weight.shape[1]


def chain_layout(carried: list[int], num_ensemble: int, offset: int) -> list[tuple[int, int, int, int]]:
    """Rows of the prompt-token chains hung under tree nodes: node i carries carried[i] prompt tokens per ensemble
    member, each chain causal (the thesis's ensemble mask). One (k, member, parent row, owner node) per row; rows
    are numbered from `offset`, after the tree's own rows."""
    rows = []
    for node, count in enumerate(carried):
        for member in range(num_ensemble):
            parent = node
            for k in range(count):
                rows.append((k, member, parent, node))
                parent = offset + len(rows) - 1
    return rows


class PPDDrafter(Drafter):
    name = "ppd"
    tree_policies = ("native", "hardware_aware")

    def __init__(self, target, tree: TreePolicy, checkpoint: str | None = None, topk: int = 10,
                 accept_prob: str | list | None = None) -> None:
        """tree.budget counts every row of the forward: root, candidates and prompt tokens. accept_prob: per prompt
        token, the accuracy of each rank (a calibration JSON, a preset or inline), which the sparse tree is built
        from; null takes the artifact's (a published checkpoint carries none)."""
        meta, tensors = load_drafter_checkpoint(checkpoint, "ppd", target)  # ours, or the PPD repository's layout
        arch = meta["arch"]
        self.prompts = PromptTokens(arch["num_prompt_tokens"], arch["num_ensemble"], arch["hidden_size"])
        try:
            self.prompts.load_state_dict(tensors)
        except RuntimeError as exc:
            raise SpecbenchError(f"checkpoint '{checkpoint}' does not hold the PPD prompt tokens its JSON describes "
                                 f"({str(exc).splitlines()[0]})") from exc
        self.embeds = self.prompts.weight.detach().to(target.model.device, target.model.dtype)
        self.m, self.n_e = self.prompts.num_prompt_tokens, self.prompts.num_ensemble
        acc = (load_accept_prob(accept_prob, "method.drafter.accept_prob") if accept_prob is not None
               else meta["metrics"].get("rank_accuracy"))
        if acc is None or len(acc) < self.m:
            raise SpecbenchError(f"PPD's sparse tree needs the accuracy of each rank for each of the {self.m} prompt "
                                 f"tokens; checkpoint '{checkpoint}' carries {'none' if acc is None else len(acc)}: "
                                 f"give method.drafter.accept_prob (a preset such as medusa_vicuna_7b_accuracies to "
                                 f"start from, then the JSON of `python run.py task=calibrate method=ppd ...`)")
        self._acc = [row[:topk] for row in acc]
        if isinstance(tree, HardwareAwarePolicy) and tree.accept_table is not None:
            raise SpecbenchError("tree.accept_prob must stay null for PPD: its tree is sized from its artifact's "
                                 "per-prompt-token accuracies, which is what it drafts with")
        self.tree = tree
        self._use_budget(None if isinstance(tree, HardwareAwarePolicy) else tree.budget)  # hardware-aware: fit()
        self._k = self.m  # state T_k: prompt tokens the last accepted node carried
        self._probs: torch.Tensor | None = None  # (m, V) guesses for depths 1..m below the next root
        self._carried: list[int] = []

    def _use_budget(self, budget: int | None) -> None:
        """The thesis's dynamic sparse tree at `budget` rows: one tree per state T_k."""
        self.budget = budget
        self.states: dict[int, PPDState] = {} if budget is None else dynamic_sparse_tree(self._acc, self.m, budget,
                                                                                          self.n_e)
        self.policies = {k: s.policy for k, s in self.states.items()}

    def fit(self, latency_ms) -> None:
        """tree=hardware_aware: the thesis's n* = argmax tau(n) / L(n) up to tree.budget, n every row verified, tau(n)
        from the artifact's held-out accuracies."""
        if not isinstance(self.tree, HardwareAwarePolicy):
            return
        best, rates = hardware_aware_budget(self._acc, self.m, self.n_e, self.tree.max_budget, latency_ms)
        log.info("PPD hardware-aware size: n* = %d rows (tau/L over n = %d..%d)", best, min(rates), self.tree.max_budget)
        self._use_budget(best)

    def prefill_extras(self, prompt: TokenTree) -> tuple[torch.Tensor, torch.Tensor]:
        """The last prompt token carries m prompt tokens in the prefill, as a root does in a step, so the first step
        already verifies guesses (observe reads them from the prefill)."""
        self._carried = [0] * (len(prompt) - 1) + [self.m]
        return self.verify_extras(prompt)

    def reset(self, state: DecodeState) -> None:
        self._probs, self._k = None, self.m  # a prefill without prompt tokens (no room in the context): root alone

    def propose(self, state: DecodeState) -> TokenTree:
        if self.budget is None:
            raise SpecbenchError("tree=hardware_aware has no latency curve: the evaluator fits PPD to the machine "
                                 "profile or the hw roofline (Drafter.fit) before it decodes")
        policy = None if self._probs is None else self.policies[self._k]
        if policy is None:  # after a plain prefill, or a state without candidates: the root and its prompt tokens only
            self._carried = [self.m]
            return TokenTree.chain(state.root, [])
        self._carried = self.states[self._k].carried
        return policy.build(state.root, self)

    def expand(self, tree: GrowingTree, nodes: list[int]) -> torch.Tensor:
        """Prompt token d's guess after a node at depth d-1; floored so every rank the tree asks for exists (node i
        of the built tree must stay path i of the state)."""
        return self._probs[[tree.depths[n] for n in nodes]].clamp_min(1e-12)

    def verify_extras(self, tree: TokenTree) -> tuple[torch.Tensor, torch.Tensor]:
        ks, members, parents, _ = zip(*chain_layout(self._carried, self.n_e, len(tree)))
        return self.embeds[list(ks), list(members)], torch.tensor(parents)

    def observe(self, outcome: StepOutcome) -> None:
        """The accepted node's prompt-token logits become the next guesses; how many it carried picks T_k."""
        node, n = outcome.path[-1], len(outcome.tree)
        carried = self._carried[node]
        logits = torch.zeros(carried, outcome.verify.logits.shape[-1])
        for row, (k, _, _, owner) in enumerate(chain_layout(self._carried, self.n_e, n)):
            if owner == node:
                logits[k] += outcome.verify.logits[n + row].float().cpu() / self.n_e
        self._probs = logits.softmax(-1)
        self._k = carried

    def parameters_bytes(self) -> tuple[int, int]:
        return self.prompts.weight.numel(), self.embeds.numel() * self.embeds.element_size()
