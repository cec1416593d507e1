"""Drafter checkpoints in the seeds' own published layouts (FasterDecoding's Medusa heads, SafeAILab's EAGLE and
EAGLE-3 heads and SpecForge's, vLLM's speculators folders, PPD's prompt tokens), loaded beside specbench's own artifacts
by the same `method.checkpoint`.

`load_drafter_checkpoint` answers (metadata, tensors) in the layout the drafter loads: a specbench artifact as
`load_artifact` reads it, or a published folder mapped onto it. Published checkpoints carry no held-out accuracies
(`metrics` is empty), so trees built from them (tree=greedy, PPD's sparse tree) take the accuracies from the config.
"""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.models.artifact import load_artifact
from specbench.models.published.eagle import eagle_checkpoint, published_eagle_head
from specbench.models.published.files import LAYOUTS, find_published, resolve
from specbench.models.published.medusa import medusa_checkpoint
from specbench.models.published.ppd import ppd_checkpoint
from specbench.models.published.speculators import (check_export_folder, is_speculators, save_speculators,
                                                    speculators_checkpoint)


def _eagle(ckpt, target):
    """A speculators config says so (speculators_model_type); any other config.json is SafeAILab's layout."""
    return (speculators_checkpoint if is_speculators(ckpt.config) else eagle_checkpoint)(ckpt, target)


CONVERTERS = {"medusa": medusa_checkpoint, "eagle": _eagle, "ppd": ppd_checkpoint}

__all__ = ["LAYOUTS", "check_export_folder", "load_drafter_checkpoint", "published_eagle_head", "save_speculators"]


def load_drafter_checkpoint(path, method: str, target) -> tuple[dict, dict]:
    """(metadata, tensors) of method's checkpoint at path for target: ours, or a published layout mapped onto ours."""
    ckpt = find_published(path)
    if ckpt is None:
        local = resolve(path) if path else None
        if local is not None and not local.exists() and not local.with_suffix(".safetensors").exists():
            raise SpecbenchError(f"checkpoint '{path}' does not exist: give a specbench artifact (.safetensors beside "
                                 f"its .json), a folder in a published layout ({LAYOUTS}), or a hub id already in "
                                 f"the local Hugging Face cache (runs never download: fetch it first, e.g. "
                                 f"`hf download {path} --local-dir DIR`)")
        return load_artifact(path, method, target)
    if ckpt.kind != method:
        raise SpecbenchError(f"checkpoint '{ckpt.folder}' is in the published {ckpt.name} layout, not {method}'s "
                             f"({LAYOUTS}); use method={ckpt.kind} or a {method} checkpoint")
    if method not in CONVERTERS:
        raise SpecbenchError(f"method={method} loads specbench artifacts only; published layouts exist for "
                             f"{', '.join(CONVERTERS)}")
    return CONVERTERS[method](ckpt, target)
