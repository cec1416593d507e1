"""An early-exit draft: the target's first N decoder layers, then its final norm and LM head.

It shares the target's modules (no weight copy, no extra memory) and its tokenizer, so it is a same-vocabulary draft
that needs no training or download. It runs through the model's own forward (a shallow view whose config says N
layers), keeps its own KV cache, and accepts the same 4D tree masks as the target.
"""

from __future__ import annotations

import copy

import torch

from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel, shallow_view


def early_exit(target: LoadedModel, num_layers: int) -> LoadedModel:
    model = target.model
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "norm") or not hasattr(model, "lm_head"):
        raise SpecbenchError(f"model '{target.name}' has no model.layers / model.norm / lm_head: early exit supports "
                             f"Llama-style decoders only; give method.draft.model instead")
    if not 1 <= num_layers <= len(layers):
        raise SpecbenchError(f"method.draft.early_exit_layers={num_layers} is invalid: '{target.name}' has "
                             f"{len(layers)} layers, so use 1..{len(layers)}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    view_base = shallow_view(base)
    view_base.layers = torch.nn.ModuleList(list(layers)[:num_layers])  # the same layer objects
    view_base.config = config
    view = shallow_view(model)
    view.model = view_base
    view.config = config
    return LoadedModel(name=f"{target.name}[:{num_layers}]", model=view, tokenizer=target.tokenizer,
                       source=f"first {num_layers} layers of {target.source}")

