"""task=export: an EAGLE-3 head written as a vLLM speculators checkpoint, which vLLM serves (`vllm serve DIR`, the
verifier read from its config) and SGLang and speculators load.

    python run.py task=export method=eagle method.checkpoint=outputs/train/<run>/eagle.safetensors \
        export.out=DIR export.verifier=HuggingFaceTB/SmolLM2-135M-Instruct

method.checkpoint is any EAGLE-3 head specbench loads: one trained here with method.head=eagle3, or a published
SafeAILab, SpecForge or speculators folder. specbench's own fc_first head has no speculators form (one error line).
"""

from __future__ import annotations

import re
from pathlib import Path

from specbench.drafters.eagle import load_eagle_head
from specbench.errors import SpecbenchError
from specbench.models.artifact import resolve_checkpoint
from specbench.models.published import check_export_folder, save_speculators
from specbench.tasks._common import build_model


def run(cfg) -> Path:
    settings = cfg.export
    if cfg.method.name != "eagle":
        raise SpecbenchError(f"task=export writes EAGLE-3 heads (method=eagle), not method={cfg.method.name}: the "
                             f"speculators format has no Medusa or other head of specbench's methods")
    if not settings.out:
        raise SpecbenchError("export.out is not set: give export.out=DIR, the folder to write the speculators "
                             "checkpoint into")
    check_export_folder(Path(settings.out), resolve_checkpoint(str(cfg.method.checkpoint)))  # before the model loads
    target = build_model(cfg.model, dtype="float32")
    head, _ = load_eagle_head(target, cfg.method.checkpoint)
    verifier = settings.verifier or default_verifier(target)
    folder = save_speculators(settings.out, head, target, verifier, settings.dtype, settings.speculative_tokens)
    print(f"speculators EAGLE-3 checkpoint for verifier '{verifier}' written to {folder}; serve it with "
          f"`vllm serve {folder}`")
    return folder


def default_verifier(target) -> str:
    """The target's source where it names one (a local path or a hub id), else its name (an in-process model)."""
    source = str(target.source)
    return source if Path(source).exists() or re.fullmatch(r"[\w.-]+/[\w.-]+", source) else target.name
