"""Drafter artifacts: `<name>.safetensors` (weights) beside `<name>.json` (what it is and how it was trained).

Loading validates before any tensor is used: the JSON must be ours, for the expected method, and for the target
being decoded (same base model, hidden size and vocabulary); weights are read with safetensors only. A drafter
trained with the target (Medusa-2) stores the target's LoRA adapter in the same file, so the artifact alone rebuilds
the backbone it was trained to draft for (`tuned_backbone`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel

FORMAT = "specbench-drafter"
VERSION = 1
ADAPTER_PREFIX = "adapter."  # tensors of the target's LoRA adapter (Medusa-2), stored beside the drafter's own


def base_model_info(target) -> dict:
    """What an artifact must match in the target (a LoadedModel)."""
    cfg = target.model.config
    return {"name": target.name, "hidden_size": int(cfg.hidden_size), "vocab_size": int(cfg.vocab_size),
            "num_hidden_layers": int(cfg.num_hidden_layers)}


REPO_ROOT = Path(__file__).resolve().parents[2]


def _paths(path: str | Path) -> tuple[Path, Path]:
    path = resolve_checkpoint(path)
    if path.is_dir():
        found = sorted(path.glob("*.safetensors"))
        if len(found) != 1:
            raise SpecbenchError(f"checkpoint directory '{path}' holds {len(found)} .safetensors files; point "
                                 f"method.checkpoint at exactly one drafter artifact (.safetensors with its .json)")
        path = found[0]
    return path.with_suffix(".safetensors"), path.with_suffix(".json")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint path as given, or against the repo root (shipped artifacts work from any working directory)."""
    path = Path(path).expanduser()
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        path = REPO_ROOT / path
    return path


def save_artifact(path: str | Path, method: str, target, arch: dict, tensors: dict[str, torch.Tensor],
                  train: dict | None = None, metrics: dict | None = None) -> Path:
    weights, meta = _paths(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(weights))
    meta.write_text(json.dumps({"format": FORMAT, "version": VERSION, "method": method,
                                "base_model": base_model_info(target), "arch": arch, "train": train or {},
                                "metrics": metrics or {}}, indent=2, default=str))
    return weights


def load_artifact(path: str | Path | None, method: str, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of a checked artifact for `method` on `target`; a clear SpecbenchError otherwise."""
    if not path:
        raise SpecbenchError(f"method={method} needs a trained artifact: set method.checkpoint=PATH "
                             f"(train one with `python run.py task=train method={method}`)")
    weights, meta_path = _paths(path)
    if not weights.exists():
        raise SpecbenchError(f"checkpoint '{weights}' does not exist; set method.checkpoint to a .safetensors "
                             f"artifact written by `python run.py task=train method={method}`")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecbenchError(f"checkpoint '{weights}' is not a specbench drafter artifact: its config "
                             f"'{meta_path}' is missing or unreadable ({exc.__class__.__name__})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SpecbenchError(f"checkpoint '{weights}' is not a specbench drafter artifact ('{meta_path}' lacks "
                             f"\"format\": \"{FORMAT}\")")
    if meta.get("method") != method:
        raise SpecbenchError(f"checkpoint '{weights}' holds a '{meta.get('method')}' drafter, not a '{method}' one; "
                             f"use method={meta.get('method')} or a {method} checkpoint")
    want, have = base_model_info(target), meta.get("base_model", {})
    for key, label in (("name", "base model"), ("hidden_size", "hidden size"), ("vocab_size", "vocabulary size"),
                       ("num_hidden_layers", "layer count")):
        if have.get(key) != want[key]:
            raise SpecbenchError(f"checkpoint '{weights}' was trained for {label} {have.get(key)!r}, but the target "
                                 f"'{target.name}' has {want[key]!r}; train one for this model "
                                 f"(`python run.py task=train method={method} model={target.name}`)")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise SpecbenchError(f"checkpoint '{weights}' is not a readable safetensors file ({exc})") from exc
    return meta, tensors


def tuned_backbone(target, lora: dict, tensors: dict[str, torch.Tensor], label: str):
    """A copy of target (a LoadedModel, or the DictConfig Hydra makes of it) with a LoRA adapter (peft LoraConfig kwargs and its state dict) merged into
    its weights, named `<target>+<label>`; target itself stays the original model."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    model = get_peft_model(copy.deepcopy(target.model), LoraConfig(**lora))
    loaded = set_peft_model_state_dict(model, tensors)
    missing = [k for k in loaded.missing_keys if "lora_" in k]
    if loaded.unexpected_keys or missing or not tensors:
        raise SpecbenchError(f"the LoRA adapter of '{label}' does not fit its config {lora} (unexpected "
                             f"{list(loaded.unexpected_keys)[:3]}, missing {missing[:3]}); retrain it")
    merged = model.merge_and_unload().to(target.model.dtype).eval()
    return LoadedModel(name=f"{target.name}+{label}", model=merged, tokenizer=target.tokenizer, source=target.source,
                       chat_template=target.chat_template)
