"""The machine this process runs on, as facts that decide its speed: every record and machine profile carries them."""

from __future__ import annotations

import hashlib
import json
import platform
from functools import lru_cache

import torch


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def _static_facts() -> dict:
    import transformers

    return {"cpu_model": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch_version": torch.__version__, "transformers_version": transformers.__version__}


def machine_info() -> dict:
    """CPU model, the instruction set torch dispatches to (AVX2, AVX512, ...), threads, GPU, library versions."""
    return {**_static_facts(), "threads": torch.get_num_threads()}


def identity(info: dict | None = None) -> dict:
    """The facts that change a timing or, through kernels' summation orders, a logit: a profile or a run folder made
    under other ones is another machine's."""
    info = info or machine_info()
    return {k: info[k] for k in ("cpu_model", "cpu_capability", "threads", "gpu_name", "torch_version")}


def fingerprint(info: dict | None = None) -> str:
    """A short hash of identity(): profiles measured under one fingerprint are reused only under it."""
    return hashlib.sha1(json.dumps(identity(info), sort_keys=True).encode()).hexdigest()[:12]
