"""Swapping a model's linear layers on a shallow view, and fusing the projections that read one input.

A backend (prepacked oneDNN) or a weight format (int8, int4) replaces every nn.Linear of a transformers model without
forking its modelling code: `replace_linears` builds views down every path to a linear, so the original model keeps
its layers and every other module and parameter stays shared.

`fuse_projections` cuts the per-layer fixed cost: q/k/v (and the MLP's gate/up) read the same hidden state, so one
GEMM over their concatenated weights replaces three (two) calls, each of which pays a kernel's dispatch and streams its
own small weight. The attention module still calls q_proj, k_proj and v_proj: each is a `FusedPart` of one shared
`FusedProjection`, whose first call computes all outputs and whose later calls on the same input tensor return their
slice. Output columns are computed independently of the others, so a fused layer's slices equal the separate layers'
outputs (tests/test_quantized.py checks it bitwise for each kernel).
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.models.loading import shallow_view

# children of one module that read the same input (Llama, Qwen, Mistral, Gemma naming)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def replace_linears(model: nn.Module, make) -> nn.Module:
    """A shallow view of `model` with every nn.Linear replaced by make(linear). A module reached by several paths (a
    FusedProjection, shared by its parts) gets one replacement, so the parts keep sharing it."""
    views: dict[int, nn.Module] = {}

    def view_of(module: nn.Module) -> nn.Module:
        if id(module) not in views:
            if isinstance(module, nn.Linear):
                views[id(module)] = make(module)
            elif any(isinstance(m, nn.Linear) for m in module.modules()):
                view = shallow_view(module)
                view._modules = {name: None if child is None else view_of(child)
                                 for name, child in module._modules.items()}
                views[id(module)] = view
            else:
                views[id(module)] = module
        return views[id(module)]

    return view_of(model)


class FusedProjection(nn.Module):
    """One linear over the concatenated weights of projections that read the same input; `outputs(x)` splits its
    result. The last result is kept until every part has read it, keyed by the input tensor's identity and version
    counter, so a part called on another tensor (or on the same one changed in place, outside inference mode)
    computes afresh: the memo saves work and changes no output."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        first = linears[0]
        fused = nn.Linear(first.in_features, sum(m.out_features for m in linears), bias=first.bias is not None,
                          device=first.weight.device, dtype=first.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([m.weight for m in linears]))
            if first.bias is not None:
                fused.bias.copy_(torch.cat([m.bias for m in linears]))
        fused.requires_grad_(False)
        self.linear = fused
        self.sizes = [m.out_features for m in linears]
        self._memo = None  # (input, its version, outputs, parts not yet served)

    def __copy__(self) -> FusedProjection:  # a shallow view (replace_linears) starts without the memo
        view = self.__class__.__new__(self.__class__)
        view.__dict__.update(self.__dict__)
        view._memo = None
        return view

    def outputs(self, x: torch.Tensor, part: int) -> torch.Tensor:
        if torch.compiler.is_compiling():  # dynamo cannot trace the memo; the graph's CSE merges the repeated GEMM
            return self.linear(x).split(self.sizes, dim=-1)[part]
        memo, version = self._memo, _version(x)
        if memo is None or memo[0] is not x or memo[1] != version or part not in memo[3]:
            memo = (x, version, self.linear(x).split(self.sizes, dim=-1), set(range(len(self.sizes))))
        memo[3].discard(part)
        self._memo = memo if memo[3] else None
        return memo[2][part]


def _version(x: torch.Tensor) -> int | None:
    """The tensor's in-place version counter; None for an inference-mode tensor, which keeps none: there the memo
    rests on identity and on being dropped once each part has read it (attention modules change no projection input
    in place between their q, k and v calls)."""
    return None if x.is_inference() else x._version


class FusedPart(nn.Module):
    """Stands where one of the fused projections was: its slice of the shared FusedProjection's output."""

    def __init__(self, fused: FusedProjection, part: int) -> None:
        super().__init__()
        self.fused, self.part = fused, part
        self.out_features = fused.sizes[part]
        self.in_features = fused.linear.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.outputs(x, self.part)


def fuse_projections(model: nn.Module) -> nn.Module:
    """A shallow view of `model` where each GROUPS set of sibling nn.Linear layers (same input size, all with or all
    without bias) is one FusedProjection; other modules and the original model are untouched. The fused weights are
    copies (the separate ones stay with the original)."""
    groups = {}
    for name, module in model.named_modules():
        for names in GROUPS:
            linears = [module._modules.get(n) for n in names]
            if (all(isinstance(m, nn.Linear) for m in linears) and len({m.in_features for m in linears}) == 1
                    and len({m.bias is None for m in linears}) == 1):
                groups.setdefault(name, []).append((names, linears))
    if not groups:
        return model
    clone, viewed = shallow_view(model), set()
    for path, found in groups.items():
        holder = clone
        for step in [s for s in path.split(".") if s]:  # views down the path (once each), then the module itself
            if id(holder._modules[step]) not in viewed:
                holder._modules[step] = shallow_view(holder._modules[step])
                viewed.add(id(holder._modules[step]))
            holder = holder._modules[step]
        for names, linears in found:
            fused = FusedProjection(linears)
            for part, name in enumerate(names):
                holder._modules[name] = FusedPart(fused, part)
    return clone
