"""Target and draft models with their tokenizers, loaded offline (GGUF packages -> a safetensors cache)."""

from specbench.models.loading import LoadedModel, load_model
from specbench.models.tiny import tiny_random

__all__ = ["LoadedModel", "load_model", "tiny_random"]
