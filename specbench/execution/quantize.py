"""Weight-only quantised targets: fewer bytes per token for a forward that streams its weights.

`model.weights=int8` stores every linear of the target (the LM head too) as int8 with one symmetric scale per output
channel, run by aten's `_weight_int8pack_mm`; `int4` stores 4-bit codes with a scale and a zero point per group of
`model.group_size` input channels (asymmetric min-max, the layout of torchao's CPU int4 and gpt-fast), run by
`_weight_int4pack_mm_for_cpu`. Both are aten CPU kernels shipped with torch, so no extra package is needed; they take
float32, bfloat16 or float16 activations (the activations' dtype is the run's `dtype`). `w8a8` quantises the
activations too, each row on its own at run time, and multiplies int8 by int8 into exact int32 sums (`torch._int_mm`,
VNNI where the CPU has it): W8A8Linear says why that is row-invariant by construction.

The kernels compute each row of the input on its own (tests/test_quantized.py checks row 0 of many-row products
against the one-row product, bitwise, at every size a tree can have), so a tree verify of the quantised target gives
exactly the logits its one-token forwards give: speculative decoding of the quantised target is lossless against that
target's own plain decoding. The quantised model is a target of its own, not the float one: `agreement` measures how
often its greedy token matches the float model's on held-out text.

Projections that read one input are fused first (execution/linears.py), then quantised: per-output-channel and per-row
groups quantise a concatenated weight exactly as its parts, so fusing changes no code and no output.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from specbench.errors import SpecbenchError
from specbench.execution import onnxruntime, openvino
from specbench.execution.attention import row_invariant
from specbench.execution.int8_grid import per_channel_int8
from specbench.execution.linears import fuse_projections, replace_linears
from specbench.models.loading import LoadedModel

# fp: the weights as loaded (float32 or the run's dtype)
FORMATS = ("fp", "int8", "int4", "w8a8", "w4a8", "w4a8r", "w8a8s")
# w4a8: int4 in groups with the activations quantised to int8 on the fly, OpenVINO's dynamic quantisation, the way its
# GenAI engine decodes (model.backend=openvino only; execution/openvino/ says why it is no verify target); w4a8r: the
# same, run row-invariant (every call of two rows or more, attention summed in an order fixed by each row's position),
# so a verify on it is its own plain decoding; w8a8s: w8a8 with each activation's scales fixed when the graph is built
# (model.backend=onnxruntime only; execution/onnxruntime/export.w8a8_products says how)
GROUPED = ("int4", "w4a8", "w4a8r")  # the formats named with their group size: int4_g64, w4a8_g64
AUTO = "auto"  # model.weights=auto: the machine profile picks the format with the cheapest verify forward
GROUP_SIZES = (32, 64, 128, 256)  # what _weight_int4pack_mm_for_cpu accepts
INT4_ROWS = 16  # _convert_weight_to_int4pack_for_cpu packs output channels in blocks of 16


def check_weights(weights: str, group_size: int = 32, where: str = "model.weights", backend: str = "eager") -> None:
    """One error line for a format or group size the kernels cannot run (the group size is checked whatever the
    format: eval.profile_weights may quantise to int4 a run whose own weights are fp). On model.backend=openvino the
    group is NNCF's to take, not aten's."""
    if weights not in (*FORMATS, AUTO):
        head, group = split_format(str(weights))
        if head != weights:  # int4_g64: a format's name, whose group size is a setting of its own here
            sizes = (f"model.group_size={group}" if group in GROUP_SIZES
                     else f"model.group_size one of {', '.join(map(str, GROUP_SIZES))}")
            raise SpecbenchError(f"{where}='{weights}' is unknown: the group size is a setting of its own, so give "
                                 f"{where}={head} {sizes}")
        raise SpecbenchError(f"{where}='{weights}' is unknown; valid choices: {', '.join(FORMATS)}, {AUTO}")
    if backend == "openvino":
        if problem := openvino.group_error(group_size):
            raise SpecbenchError(f"model.group_size={group_size!r} is invalid for int4 weights on "
                                 f"model.backend=openvino: {problem}")
    elif backend == "onnxruntime":
        if group_size not in onnxruntime.INT4_GROUPS or isinstance(group_size, bool):
            raise SpecbenchError(f"model.group_size={group_size!r} is invalid for int4 weights on "
                                 f"model.backend=onnxruntime: give one of "
                                 f"{', '.join(map(str, onnxruntime.INT4_GROUPS))} (the blocks MatMulNBits takes)")
    elif isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise SpecbenchError(f"model.group_size={group_size!r} is invalid for int4 weights: give one of "
                             f"{', '.join(map(str, GROUP_SIZES))} (the group sizes aten's CPU int4 kernel takes)")


def backend_problem(weights: str, backend: str) -> str | None:
    """Why `backend` cannot run these weights on any device (w4a8 and w4a8r are OpenVINO's own), None when it can."""
    head = split_format(weights)[0]
    if head in openvino.OWN_FORMATS and backend != "openvino":
        return f"{head} is OpenVINO's dynamic quantisation of activations: it runs on model.backend=openvino only"
    if head in onnxruntime.OWN_FORMATS and backend != "onnxruntime":
        return (f"{head} is built into ONNX Runtime's graph from calibrated ranges: it runs on "
                "model.backend=onnxruntime only")
    if backend == "onnxruntime":
        return onnxruntime.weights_problem(weights)
    return None


def check_backend_weights(weights: str, backend: str) -> None:
    """One error line for model.weights a model.backend cannot run, before any model loads."""
    reason = backend_problem(weights, backend)
    if reason:
        raise SpecbenchError(f"model.weights={weights} with model.backend={backend}: {reason}; set "
                             f"model.backend={owning_backend(weights)}")


def owning_backend(weights: str) -> str:
    """The backend to name where `backend_problem` refuses these weights: onnxruntime for its own formats, else
    openvino (its own formats, and the builder's refusals)."""
    return "onnxruntime" if split_format(weights)[0] in onnxruntime.OWN_FORMATS else "openvino"


def format_name(weights: str, group_size: int) -> str:
    """The weight format as the roofline prices it (models/shape.py): int4 with its group size, whose scales and zeros
    add bytes per parameter."""
    return f"{weights}_g{group_size}" if weights in GROUPED else weights


def split_format(weights: str, group_size: int = 32) -> tuple[str, int]:
    """(weights, group_size) of a config name (int4 with model.group_size) or of a format name (int4_g64)."""
    head, _, group = weights.partition("_g")
    return (head, int(group)) if head in GROUPED and group.isdigit() else (weights, group_size)


def supported(weights: str, device: torch.device, backend: str = "eager") -> str | None:
    """None when `weights` (a config or format name) can run on `device` under `backend`, else why not (one line)."""
    weights = split_format(weights)[0]
    if weights == "fp":
        return None
    if reason := backend_problem(weights, backend):
        return reason
    if torch.device(device).type != "cpu":
        return f"{weights} weights run aten's CPU kernels (_weight_int8pack_mm, _weight_int4pack_mm_for_cpu, _int_mm)"
    if backend == "prepacked":
        return f"{weights} weights leave no float linear to pack: eager runs the same kernels"
    if backend == "openvino":  # NNCF compresses the float weights: what it cannot do is openvino's to say
        return openvino.unsupported(torch.float32, torch.device(device), weights)
    if backend == "onnxruntime":  # the builder quantises the float weights: its own say
        return onnxruntime.unsupported(torch.float32, torch.device(device), weights)
    return None


class Int8Linear(nn.Module):
    """y = x (q s)^T + b: q int8 [out, in], s one scale per output channel (symmetric, max |w| -> 127). The float
    weight stays reachable as `.weight` (a tied LM head, Medusa's heads and published EAGLE heads read it); only q and
    s are used. s follows the model's dtype (cast with it): the kernel wants it in the activations' dtype."""

    weight_format = "int8"  # what the roofline prices (models/shape.py)

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        codes, scales = per_channel_int8(linear.weight)
        self.register_buffer("qweight", codes, persistent=False)
        self.register_buffer("scales", scales.to(linear.weight.dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).contiguous(), self.qweight, self.scales)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class Int4Linear(nn.Module):
    """y = x w^T + b with w = (q - 8) s + z per group of `group_size` input channels: q in 0..15 (min-max over the
    group, asymmetric), packed by aten into its CPU layout. Output channels are padded with zero rows to a multiple
    of 16 (the packing's block) and the padding sliced off the output. `.weight` as in Int8Linear."""

    def __init__(self, linear: nn.Linear, group_size: int) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features, self.group_size = linear.in_features, linear.out_features, group_size
        self.weight_format = format_name("int4", group_size)  # what the roofline prices (models/shape.py)
        if self.in_features % group_size:
            fits = ", ".join(str(g) for g in GROUP_SIZES if not self.in_features % g)
            raise SpecbenchError(f"model.group_size={group_size} does not divide a linear's {self.in_features} input "
                                 "channels; " + (f"give one of {fits}" if fits else "none does: use int8 weights"))
        w = linear.weight.detach().float()
        rows = -(-self.out_features // INT4_ROWS) * INT4_ROWS
        w = torch.cat([w, w.new_zeros(rows - self.out_features, self.in_features)])
        groups = w.reshape(rows, -1, group_size)
        low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
        scales = (high - low).clamp(min=1e-6) / 15
        codes = ((groups - low) / scales).round().clamp(0, 15).to(torch.int32).reshape(rows, -1)
        zeros = low + 8 * scales  # the kernel computes (q - 8) * s + z
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), persistent=False)
        self.register_buffer("scales_and_zeros", torch.cat([scales, zeros], dim=-1).transpose(0, 1).contiguous()
                             .to(linear.weight.dtype), persistent=False)  # [in / group, out, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features).contiguous(), self.packed,
                                                         self.group_size, self.scales_and_zeros)
        out = out[:, : self.out_features].reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class W8A8Linear(nn.Module):
    """y = (qx qw^T) sx sw + b: qw and sw as Int8Linear's; each row of x quantised when it arrives (symmetric, its own
    max |x| -> 127, sx one scale per row); the int8 product summed exactly in int32 by torch._int_mm.

    The layer is row-invariant by construction, whatever the kernel's blocking: a row's codes and scale depend on that
    row alone (a max is exact in any order), an integer sum has no rounding order, and the float epilogue is
    elementwise. The model around it is not by itself: transformers' attention sums a many-row and a one-row product
    in other orders (~1e-8 apart in fp32), and quantising the activations turns such a difference into a whole code
    step where it crosses a rounding boundary, enough to change answers of a w8a8 target's own plain decoding under
    speculation (experiments/w8a8_same_model; weight-only int8 and int4 keep them: a 1e-8 difference stays 1e-8).
    So a w8a8 target runs its attention in float64 (execution/attention.py `row_invariant`), which makes the whole
    forward row-invariant, as its tests check bitwise."""

    weight_format = "w8a8"  # what the roofline prices (models/shape.py)

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        codes, scales = per_channel_int8(linear.weight)
        self.register_buffer("qweight_t", codes.t().contiguous(), persistent=False)  # [in, out]: _int_mm's B
        self.register_buffer("scales", scales, persistent=False)  # cast with the model; the epilogue runs in float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        row_scales = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / 127
        codes = (rows / row_scales).round().clamp(-127, 127).to(torch.int8)
        out = torch._int_mm(codes, self.qweight_t).float() * row_scales * self.scales.float()
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def quantised_linear(linear: nn.Linear, weights: str, group_size: int = 32) -> nn.Module:
    """`linear` in `weights` (int8, int4 with group_size, w8a8, or a format name such as int4_g64)."""
    weights, group_size = split_format(weights, group_size)
    if weights == "w8a8":
        return W8A8Linear(linear)
    return Int8Linear(linear) if weights == "int8" else Int4Linear(linear, group_size)


def with_weights(target: LoadedModel, weights: str, group_size: int = 32, fuse: bool = True) -> LoadedModel:
    """`target` with its linears (the LM head too) in `weights` (fp, int8, int4 with group_size, or a format name
    such as int4_g64), on a shallow view (the original keeps its float layers; embeddings, norms and the float weights
    stay shared), quantised from the weights as they are: load in float32, quantise, then cast, so the codes do not
    depend on the run's dtype. fp returns target itself. fuse: q/k/v and gate/up fused first (execution/linears.py);
    False keeps them apart, which tests compare against."""
    weights, group_size = split_format(weights, group_size)
    check_weights(weights, group_size)
    if weights == AUTO:
        raise SpecbenchError("model.weights=auto is resolved by the evaluator from the machine profile; "
                             f"with_weights needs one of: {', '.join(FORMATS)}")
    if format_name(weights, group_size) == target.weights:
        return target
    if target.weights != "fp" or target.backend != "eager":
        raise SpecbenchError(f"quantise the eager float model to {weights}; this one is {target.weights} on backend "
                             f"'{target.backend}'")
    reason = supported(weights, target.model.device)
    if reason:
        raise SpecbenchError(f"model.weights={weights} cannot run on {target.model.device}: {reason}")
    model = replace_linears(fuse_projections(target.model) if fuse else target.model,
                            lambda linear: quantised_linear(linear, weights, group_size))
    if weights == "w8a8":  # W8A8Linear says why its model needs row-invariant attention
        model = row_invariant(model)
    return dataclasses.replace(target, model=model, weights=format_name(weights, group_size))


@torch.inference_mode()
def agreement(reference: torch.nn.Module, model: torch.nn.Module, sequences: list[list[int]]) -> dict:
    """Teacher-forced fidelity of `model` to `reference` over `sequences` (token ids, each fed whole): the share of
    next-token positions where both pick the same greedy token, and each one's perplexity on the text itself."""
    same = total = 0
    nll = {"reference": 0.0, "model": 0.0}
    for ids in sequences:
        ids = torch.tensor(ids, device=reference.device)[None]
        ref, out = (m(input_ids=ids).logits[0, :-1].float() for m in (reference, model))
        same += int((ref.argmax(-1) == out.argmax(-1)).sum())
        total += ref.shape[0]
        for name, logits in (("reference", ref), ("model", out)):
            nll[name] += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
    return {"positions": total, "agreement": same / total, "perplexity": math.exp(nll["model"] / total),
            "reference_perplexity": math.exp(nll["reference"] / total)}
