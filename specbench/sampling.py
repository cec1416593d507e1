"""Sampling parameters shared by plain decoding and every method, so both draw from the same target distribution."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut

    def __post_init__(self) -> None:
        real = isinstance(self.temperature, (int, float)) and not isinstance(self.temperature, bool)
        if not real or not math.isfinite(self.temperature) or self.temperature < 0:
            raise SpecbenchError(f"sampling.temperature={self.temperature!r} is invalid: use 0 (greedy) or a finite "
                                 f"value > 0")
        real = isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool)
        if not real or not 0 < self.top_p <= 1:  # NaN fails the comparison too
            raise SpecbenchError(f"sampling.top_p={self.top_p!r} is invalid: it must lie in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise SpecbenchError(f"sampling.top_k={self.top_k!r} is invalid: use 0 (off) or a positive integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Target distribution(s) after temperature, top-k and top-p; one-hot at the argmax when greedy."""
        logits = logits.float()
        if self.greedy:
            return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
        logits = logits / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop_sorted = cum - sorted_logits.softmax(-1) >= self.top_p  # keep the smallest prefix reaching top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(-1)

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> int:
        if self.greedy:
            return int(greedy_tokens(logits))
        return int(torch.multinomial(self.probs(logits), 1, generator=generator))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, the first of equal maxima (a NaN counts as the maximum), as torch.argmax gives it. On a CPU
    float32 tensor numpy's argmax computes it: torch's CPU argmax over a vocabulary row is an order of magnitude
    slower, a visible share of a small model's step, paid every step (experiments/onnxruntime_verify)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(np.asarray(np.argmax(logits.numpy(), -1)))
    return logits.argmax(-1)
