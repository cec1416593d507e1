"""What a forward run by another runtime's graph keeps of the PyTorch model (OpenVINO's and ONNX Runtime's): the
embedding as a module, so `get_input_embeddings`, `parameters()` and the memory accounting see it, the config and the
generation config; float32 activations on the embedding's device."""

from __future__ import annotations

import torch
from torch import nn


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
