"""A drafter's vocabulary projection run by OpenVINO in int8 (Drafter.on_openvino)."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from specbench.execution.openvino.compile import compiled
from specbench.execution.openvino.export import compressed, interrupt_after


class OpenVinoLinear(nn.Module):
    """An nn.Linear run by OpenVINO with NNCF's int8 weights (symmetric per output channel), float32 activations: a
    drafter's vocabulary projection, which it computes at every tree level and eager PyTorch reads as the whole float32
    matrix each time (experiments/openvino_same_model). For drafting only: the target's verify decides every token, so
    a draft head in int8 leaves a run lossless. `weight` stays the float one, which callers read for its shape and
    dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        import openvino as ov

        self.weight, self.in_features, self.out_features = linear.weight, linear.in_features, linear.out_features
        source = linear if linear.weight.dtype == torch.float32 else copy.deepcopy(linear).float()
        with torch.no_grad(), warnings.catch_warnings(), interrupt_after("conversion of a draft head"):
            warnings.simplefilter("ignore")
            ir = ov.convert_model(source, example_input=torch.zeros(2, self.in_features))
        ir.inputs[0].get_node().set_partial_shape(ov.PartialShape([-1, self.in_features]))
        ir.validate_nodes_and_infer_types()
        self.request = compiled(compressed(ir, "int8")).create_infer_request()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.detach().reshape(-1, self.in_features).to(torch.float32).contiguous()
        self.request.infer([flat.numpy()])
        out = torch.from_numpy(self.request.get_output_tensor(0).data).clone()  # the request reuses its buffer
        return out.reshape(*x.shape[:-1], self.out_features)
