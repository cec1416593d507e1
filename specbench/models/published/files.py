"""Finding and reading a checkpoint folder in a seed's own published layout, safely.

A folder is recognised by its config file (what each repository's loader reads first): adapter_config.json with
`num_special_tokens` is PPD's peft prompt-tuning folder, config.json with `medusa_num_heads` is Medusa's, any other
config.json beside a draft state dict is EAGLE's. Tensors are read from safetensors, or from a torch state dict with
`torch.load(weights_only=True)`, which refuses a pickle that would run code instead of executing it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specbench.errors import SpecbenchError
from specbench.models.artifact import FORMAT, resolve_checkpoint

LAYOUTS = ("Medusa: config.json with medusa_num_heads + medusa_lm_head.{safetensors,pt}; EAGLE/EAGLE-3 (SafeAILab, "
           "SpecForge, vLLM's speculators): config.json + model.safetensors or pytorch_model.bin; PPD: "
           "adapter_config.json + adapter_model.{safetensors,bin}")
# weight files each layout's own loader reads, first found wins (Medusa-2 folders hold the whole tuned model)
WEIGHTS = {"medusa": ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors.index.json",
                      "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin"),
           "eagle": ("model.safetensors", "pytorch_model.bin"),
           "ppd": ("adapter_model.safetensors", "adapter_model.bin")}
NAMES = {"medusa": "Medusa", "eagle": "EAGLE", "ppd": "PPD"}


@dataclass
class Published:
    kind: str  # medusa | eagle | ppd
    folder: Path
    config: dict
    weights: list[Path]  # one file, or the shards of a sharded model

    @property
    def name(self) -> str:
        return NAMES[self.kind]

    def keys(self) -> list[str]:
        """The tensor names, read without loading a safetensors file's tensors (a torch file loads whole)."""
        names: list[str] = []
        for path in self.weights:
            if path.suffix == ".safetensors":
                try:
                    with safe_open(str(path), framework="pt") as f:
                        names += list(f.keys())
                except (SafetensorError, OSError) as exc:
                    raise SpecbenchError(f"checkpoint '{path}' is not a readable safetensors file ({exc})") from exc
            else:
                names += list(read_tensors(path))
        return names

    def tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Every tensor whose key starts with prefix (prefix removed), as stored; a safetensors file reads only those
        (a Medusa-2 folder's heads, not its 7B backbone)."""
        found: dict[str, torch.Tensor] = {}
        for path in self.weights:
            found |= {k.removeprefix(prefix): v for k, v in read_tensors(path, prefix).items()}
        return found


def check_base_model(ckpt: Published, base, target, field: str = "base_model_name_or_path") -> None:
    """The base model a published config names (`field`) must be the target: heads trained on another model whose
    shapes happen to fit would draft, and be rejected, silently. Names compare by their last path part (a hub id's
    name, a local folder's, a hub cache snapshot's repository, a GGUF file's without its quantisation),
    case-insensitively."""
    if not base or base == "unknown":
        return
    ours = {_model_name(n) for n in (target.name, target.source, getattr(target.model.config, "_name_or_path", ""))
            if n}
    if _model_name(base) not in ours:
        raise SpecbenchError(f"{ckpt.name} checkpoint '{ckpt.folder}' was trained for base model '{base}' (its "
                             f"config's {field}), but the target is '{target.name}' ({target.source}); load '{base}' "
                             f"(model.path=<its hub id or a folder named {_model_name(base)}>), or set {field} to "
                             f"'{target.name}' if it is that model under another name")


def _model_name(name) -> str:
    """'org/Name' -> 'name'; '.../models--org--Name/snapshots/<hash>' -> 'name'; '/dir/Name/' -> 'name';
    '/dir/Name.Q4_1.gguf' -> 'name'."""
    parts = Path(str(name)).parts
    for part in parts:
        if part.startswith("models--"):
            return part.split("--")[-1].lower()
    last = parts[-1].lower() if parts else ""
    return re.sub(r"[.-](q\d\w*|f16|bf16|f32)$", "", last.removesuffix(".gguf")) if last.endswith(".gguf") else last


def resolve(path) -> Path:
    """A local path (relative ones also against the repo root), or a hub id's snapshot already in the local Hugging
    Face cache: nothing is downloaded here."""
    path = resolve_checkpoint(str(path))
    if not path.exists() and len(path.parts) == 2 and not str(path).startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(str(path), local_files_only=True))
        except Exception:  # noqa: BLE001 -- not in the cache (or not a hub id): the artifact loader names the path
            return path
    return path


def find_published(path) -> Published | None:
    """The published checkpoint at path (its folder, or a file in it); None for a specbench artifact or nothing."""
    if not path:
        return None
    path = resolve(path)
    if path.is_file() and _is_artifact(path.with_suffix(".json")):
        return None
    folder = path if path.is_dir() else path.parent
    adapter, config = folder / "adapter_config.json", folder / "config.json"
    if adapter.exists() and "num_special_tokens" in (cfg := _read_json(adapter)):
        kind = "ppd"
    elif config.exists():
        cfg = _read_json(config)
        kind = "medusa" if "medusa_num_heads" in cfg else "eagle"
    else:
        return None
    return Published(kind, folder, cfg, _weights(kind, folder, path))


def _is_artifact(meta: Path) -> bool:
    try:
        return meta.exists() and json.loads(meta.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _read_json(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecbenchError(f"checkpoint config '{path}' is not readable JSON ({exc.__class__.__name__}); "
                             f"expected a published layout ({LAYOUTS})") from exc
    if not isinstance(cfg, dict):
        raise SpecbenchError(f"checkpoint config '{path}' is not a JSON object; expected a published layout "
                             f"({LAYOUTS})")
    return cfg


def _weights(kind: str, folder: Path, given: Path) -> list[Path]:
    if given.is_file() and given.suffix in (".safetensors", ".pt", ".bin"):
        return [given]
    for name in WEIGHTS[kind]:
        path = folder / name
        if path.exists():
            if name.endswith(".index.json"):  # a sharded model: every shard its weight map names
                shards = sorted(set(_read_json(path).get("weight_map", {}).values()))
                return [folder / shard for shard in shards]
            return [path]
    raise SpecbenchError(f"checkpoint folder '{folder}' has a {NAMES[kind]} config but none of its weight files "
                         f"({', '.join(n for n in WEIGHTS[kind] if not n.endswith('.json'))})")


def read_tensors(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """The {key: tensor} entries whose key starts with prefix, from a safetensors file or a torch state dict, never
    unpickling code."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, pickle.UnpicklingError, EOFError) as exc:
        raise SpecbenchError(f"checkpoint '{path}' could not be read safely ({str(exc).splitlines()[0][:160]}); "
                             f"give a safetensors file or a plain torch state dict of tensors") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecbenchError(f"checkpoint '{path}' is not a state dict of tensors (a {type(state).__name__}); give "
                             f"the published weights file ({LAYOUTS})")
    return {k: v for k, v in state.items() if k.startswith(prefix)}


FULL_HASH_BYTES = 256 << 20  # files up to this size are hashed whole; a published 7B shard by its ends and size


def content_fingerprint(path: str | Path) -> str:
    """A digest of what a checkpoint (or datastore) path holds now: a drafter retrained into the same path is other
    settings, so a run folder's records of the old one are not resumed with it. A file is hashed with the .json a
    drafter artifact has beside it; a folder (a published layout) by every file's name, size and content (the first
    and last MiB of a file over FULL_HASH_BYTES, so a 7B backbone is not read whole for its name); 'missing' when
    nothing is there."""
    path = resolve(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        files = [p for p in (path.with_suffix(".safetensors"), path.with_suffix(".json"), path) if p.is_file()]
        files = list(dict.fromkeys(files))
    if not files:
        return "missing"
    digest = hashlib.sha1()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path) if path.is_dir() else file.name}:{size}:".encode())
        with file.open("rb") as f:
            if size <= FULL_HASH_BYTES:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            else:
                digest.update(f.read(1 << 20))
                f.seek(size - (1 << 20))
                digest.update(f.read())
    return digest.hexdigest()[:12]
