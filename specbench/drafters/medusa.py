"""Medusa (Cai et al. 2024): K heads on the target's last hidden state guess the tokens 2..K+1 steps ahead.

Head k is a residual block SiLU(W1 h + b) + h followed by a vocabulary projection: its own copy initialised from the
target's LM head (the paper's architecture) or, tied, the target's LM head itself (only the blocks train and are
stored, a few MB). Drafting reads the hidden state the previous verify forward already produced at the last accepted
node, so a Medusa step costs one target forward plus the heads. A Medusa-2 artifact also holds the LoRA adapter its
backbone was tuned with: the drafter then verifies with that tuned backbone (`backbone`), the model it was trained for.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from specbench.drafters.base import DrafterCost, DecodeState, Drafter, TreeTooDeep
from specbench.errors import SpecbenchError
from specbench.execution.openvino import OpenVinoLinear
from specbench.models.loading import LoadedModel
from specbench.models.artifact import ADAPTER_PREFIX, tuned_backbone
from specbench.models.published import load_drafter_checkpoint
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.hardware_aware import HardwareAwarePolicy
from specbench.trees.static import StaticPolicy
from specbench.trees.policy import GrowingTree, TreePolicy
from specbench.trees.token_tree import TokenTree


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # starts as the identity, so head k starts as the LM head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + nn.functional.silu(self.linear(h))


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 4, num_layers: int = 1,
                 tie_lm_head: bool = True, lm_head_weight: torch.Tensor | None = None) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise SpecbenchError(f"Medusa needs num_heads >= 1 and num_layers >= 1, got {num_heads} and {num_layers}")
        self.num_heads, self.tie_lm_head = num_heads, tie_lm_head
        self.blocks = nn.ModuleList(nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)])
                                    for _ in range(num_heads))
        self.proj = None
        if not tie_lm_head:
            self.proj = nn.ModuleList(nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))
            if lm_head_weight is not None:
                for p in self.proj:
                    p.weight.data.copy_(lm_head_weight)

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """(K, *hidden.shape[:-1], V) logits; lm_head is the target's (used when tied)."""
        outs = torch.stack([block(hidden) for block in self.blocks])
        if self.proj is None:
            return lm_head(outs)
        return torch.stack([p(o) for p, o in zip(self.proj, outs)])


class MedusaDrafter(Drafter):
    """Candidates from the heads' top-k, shaped by the run's tree policy. tree=greedy (the method's default) or
    tree=hardware_aware without tree.accept_prob builds the tree from the artifact's held-out per-head rank
    accuracies (Medusa App. C). `backbone` is the LoadedModel to verify with when it is not the run's target (a
    Medusa-2 artifact's tuned backbone, its adapter merged in); None otherwise."""

    name = "medusa"
    tree_policies = ("greedy", "hardware_aware", "static", "chain", "dynamic")
    needs_hidden_states = True

    def __init__(self, target, tree: TreePolicy, checkpoint: str | None = None,
                 num_heads: int | None = None) -> None:
        meta, tensors = load_drafter_checkpoint(checkpoint, "medusa", target)  # ours, or FasterDecoding's layout
        arch = meta["arch"]
        adapter = {k.removeprefix(ADAPTER_PREFIX): tensors.pop(k) for k in list(tensors) if k.startswith(ADAPTER_PREFIX)}
        self.backbone = None
        if arch.get("lora"):
            self.backbone = target = tuned_backbone(target, arch["lora"], adapter, f"medusa2:{checkpoint}")
        heads = MedusaHeads(arch["hidden_size"], arch["vocab_size"], arch["num_heads"], arch["num_layers"],
                            arch["tie_lm_head"])
        try:
            heads.load_state_dict(tensors)
        except RuntimeError as exc:
            raise SpecbenchError(f"checkpoint '{checkpoint}' does not hold the Medusa heads its JSON describes "
                                 f"({str(exc).splitlines()[0]})") from exc
        model = target.model
        self.heads = heads.to(device=model.device, dtype=model.dtype).eval()
        self.lm_head = model.get_output_embeddings()
        if num_heads is not None and not (isinstance(num_heads, int) and 1 <= num_heads <= arch["num_heads"]):
            raise SpecbenchError(f"method.drafter.num_heads={num_heads!r} is invalid: checkpoint '{checkpoint}' holds "
                                 f"{arch['num_heads']} heads, so give an integer in 1..{arch['num_heads']} or null for "
                                 f"all of them")
        self.num_heads = num_heads or arch["num_heads"]
        if isinstance(tree, GreedyPolicy):
            accuracy = meta["metrics"].get("rank_accuracy")  # a published checkpoint carries none
            if accuracy is None and tree.accept_table is None:
                raise SpecbenchError(f"checkpoint '{checkpoint}' carries no per-head accuracies for tree={tree.name}: "
                                     f"give tree.accept_prob (a calibration JSON or a preset, e.g. Medusa's own "
                                     f"medusa_vicuna_7b_accuracies) or use tree=static (Medusa's mc_sim_7b_63)")
            tree = tree.with_accept_prob(accuracy and accuracy[: self.num_heads])
        depth = tree.depth if isinstance(tree, StaticPolicy) else 0  # greedy's too: caught before decoding
        if isinstance(tree, HardwareAwarePolicy):  # unfitted: as deep as its calibration's rows may take it
            depth = max(depth, len(tree.accept_table or []))
        if depth > self.num_heads:
            grows = "may grow" if isinstance(tree, HardwareAwarePolicy) else "is"
            raise TreeTooDeep(f"tree={tree.name} {grows} {depth} tokens deep, but the Medusa checkpoint '{checkpoint}' "
                              f"drafts with {self.num_heads} heads (one per depth); use a tree of depth <= "
                              f"{self.num_heads} (tree.accept_prob with {self.num_heads} rows, or tree.choices)",
                              self.num_heads)
        self.tree = tree
        self._probs: torch.Tensor | None = None

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> TokenTree:
        self._probs = self._head_probs(state.last.hidden[-1])
        return self.tree.build(state.root, self)

    def _head_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.heads(hidden, self.lm_head)[: self.num_heads].float().softmax(-1).cpu()

    @torch.inference_mode()
    def draft_ms(self, choices: list[list[int]]) -> float:
        """ms of the heads' one pass per step here (any tree of theirs then costs nothing more), measured once."""
        if getattr(self, "_heads_ms", None) is None:
            weight = self.lm_head.weight
            hidden = torch.zeros(weight.shape[1], device=weight.device, dtype=weight.dtype)
            times = []
            for _ in range(6):
                start = time.perf_counter()
                self._head_probs(hidden)
                times.append(time.perf_counter() - start)
            self._heads_ms = 1e3 * float(np.median(times[1:]))
        return self._heads_ms

    def expand(self, tree: GrowingTree, nodes: list[int]) -> torch.Tensor:
        """After a node at depth d comes head d+1's guess (Medusa heads see only the root's hidden state)."""
        depths = [tree.depths[n] for n in nodes]
        if max(depths) >= self.num_heads:
            raise SpecbenchError(f"the tree policy asks for depth {max(depths) + 1}, but the Medusa checkpoint has "
                                 f"{self.num_heads} heads; use a tree of depth <= {self.num_heads}")
        return self._probs[depths]

    def cost(self) -> DrafterCost:
        return DrafterCost(medusa_heads=self.num_heads)

    def on_openvino(self) -> None:
        if self.heads.proj is None:
            self.lm_head = OpenVinoLinear(self.lm_head)  # the target's own module stays as it is: this is the drafter's
        else:
            self.heads.proj = nn.ModuleList(OpenVinoLinear(p) for p in self.heads.proj)

    def on_backend(self, run_on) -> None:
        if self.backbone is not None:
            self.backbone = run_on(self.backbone)

    @property
    def verifier(self) -> LoadedModel | None:
        return self.backbone

    def parameters_bytes(self) -> tuple[int, int]:
        params = sum(p.numel() for p in self.heads.parameters())
        return params, sum(p.numel() * p.element_size() for p in self.heads.parameters())
