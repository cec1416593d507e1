"""specbench: speculative decoding experiments composed from Hydra configs."""

from specbench import openmp  # noqa: F401  first: it sets OpenMP's spin before anything loads torch

__version__ = "0.1.0"
