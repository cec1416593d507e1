"""Acceptance rules: which path of a verified tree to keep, and the next token after it."""

from specbench.acceptance.base import Acceptance, AcceptanceRule
from specbench.acceptance.exact import ExactAcceptance

__all__ = ["Acceptance", "AcceptanceRule", "ExactAcceptance"]
