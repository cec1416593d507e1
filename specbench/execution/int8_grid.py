"""The int8 grid every int8-weight format shares: symmetric codes with one scale per output channel (max |w| -> 127).

Its own room so that the eager formats (execution/quantize.py) and the onnxruntime route's w8a8 graph
(execution/onnxruntime/export.py), which quantize.py imports, quantise a weight by one rule and give the same codes.
"""

from __future__ import annotations

import torch


def per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes [out, in] of a float weight [out, in] and its float32 scales, one per output channel."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    return (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales
