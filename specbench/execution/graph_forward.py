"""What a forward run by another runtime's graph keeps of the PyTorch model (OpenVINO's and ONNX Runtime's): the
embedding as a module, so `get_input_embeddings`, `parameters()` and the memory accounting see it, the config and the
generation config; float32 activations on the embedding's device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(slots=True)
class GraphOutput:
    """A graph forward's outputs, by the names transformers' CausalLMOutputWithPast gives them (the methods read
    these two): a ModelOutput's construction (its __post_init__ over every field) was a visible share of a one-row
    step's Python (experiments/onnxruntime_verify), and the cache grew in place, so there is none to return."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


class GraphForward(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.embed = model.get_input_embeddings()
        self.config, self.generation_config = model.config, model.generation_config
        self.layers = model.config.num_hidden_layers

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_input_embeddings(self) -> nn.Module:
        return self.embed
