"""A distilled draft: the target's first N layers as trainable copies, then a trainable copy of its final norm, on
the target's own embeddings and LM head (shared, frozen).

It starts as the early-exit draft and is trained by `specbench/training/draft_distill.py` (KL to the target), so
only the N layers and the norm are new weights (14 MB in bf16 for 2 SmolLM2-135M layers), not a second model. The
trained tensors travel as a drafter artifact (method draft_model) and are put back on the target's modules here.
"""

from __future__ import annotations

import copy

import torch

from specbench.errors import SpecbenchError
from specbench.models.early_exit import early_exit
from specbench.models.loading import LoadedModel
from specbench.models.artifact import load_artifact


def shallow_draft(target: LoadedModel, num_layers: int) -> LoadedModel:
    """The early-exit view with its own copies of the first num_layers layers and the final norm."""
    draft = early_exit(target, num_layers)
    base = draft.model.model
    base.layers = torch.nn.ModuleList(copy.deepcopy(layer) for layer in base.layers)
    base.norm = copy.deepcopy(base.norm)
    draft.name = f"{target.name}-draft{num_layers}"
    draft.source = f"distilled from the first {num_layers} layers of {target.source}"
    return draft


def trained_tensors(draft: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The draft's own weights (layers and norm) from its transformers model, keyed as in the artifact."""
    base = draft.model
    return {f"layers.{k}": v for k, v in base.layers.state_dict().items()} | \
        {f"norm.{k}": v for k, v in base.norm.state_dict().items()}


def load_distilled_draft(target: LoadedModel, checkpoint: str) -> LoadedModel:
    """The draft stored in a draft_model artifact, checked against the target first (see load_artifact)."""
    meta, tensors = load_artifact(checkpoint, "draft_model", target)
    try:
        draft = shallow_draft(target, int(meta["arch"]["num_layers"]))
        base, dtype = draft.model.model, target.model.dtype
        for name, module in (("layers", base.layers), ("norm", base.norm)):
            module.load_state_dict({k.removeprefix(f"{name}."): v.to(dtype) for k, v in tensors.items()
                                    if k.startswith(f"{name}.")})
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise SpecbenchError(f"checkpoint '{checkpoint}' does not hold the distilled draft its JSON describes "
                             f"({str(exc).splitlines()[0]})") from exc
    draft.source = f"{checkpoint} ({draft.source})"
    return draft
