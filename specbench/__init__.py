"""specbench: speculative decoding experiments composed from Hydra configs."""

__version__ = "0.1.0"
