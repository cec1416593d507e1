"""Drafters: one module per method. Each proposes a TokenTree from the decoding state."""

from specbench.drafters.base import DecodeState, Drafter, StepOutcome

__all__ = ["DecodeState", "Drafter", "StepOutcome"]
