"""LLMCad (Xu et al., arXiv 2309.04255): a memory-resident draft model grows a confidence-branched token tree and
the target verifies it only when the best branch's confidence falls below an adaptive threshold alpha.

The tree, its pacer and alpha live in the tree policy (specbench/trees/llmcad.py), so `method=draft_model
tree=llmcad` runs the same algorithm. This drafter is the draft-model drafter with LLMCad's defaults: the draft (a
distilled checkpoint, an early exit or a model-group entry), its vocabulary check, one draft KV cache shared by every
branch through the tree mask, and its rollback are all the draft-model drafter's. The memory-budget projection is
specbench/hardware/modelled/llmcad.py, which prices the draft this drafter declares (Drafter.cost).
"""

from __future__ import annotations

from specbench.drafters.draft_model import DraftModelDrafter
from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel
from specbench.trees.llmcad import LLMCadPolicy


class LLMCadDrafter(DraftModelDrafter):
    name = "llmcad"
    tree_policies = ("llmcad",)

    def __init__(self, target: LoadedModel, tree: LLMCadPolicy, checkpoint: str | None = None,
                 early_exit_layers: int | None = None, **draft) -> None:
        """The shipped checkpoint is the default draft, so asking for an early exit as well is a conflict here
        (draft_model's default early exit silently yields to a checkpoint)."""
        if checkpoint is not None and early_exit_layers is not None:
            raise SpecbenchError(f"method=llmcad got two drafts: method.checkpoint={checkpoint} and "
                                 f"method.draft.early_exit_layers={early_exit_layers}; set one of them to null")
        super().__init__(target, tree, checkpoint=checkpoint, early_exit_layers=early_exit_layers, **draft)

    @property
    def alpha_history(self) -> list[float]:
        """The verification threshold each step of the current (or last) generation was drafted under."""
        return self.tree.alpha_history
