"""vLLM's speculators format (the `speculators` package, 0.9): EAGLE-3 heads read, and written for vLLM and SGLang.

Read from speculators 0.9.0 (no code copied):
- config.json is an Eagle3SpeculatorConfig (speculators/models/eagle3/config.py, on speculators/config.py's
  SpeculatorModelConfig): `speculators_model_type` "eagle3", `speculators_version`, `speculators_config` {algorithm,
  proposal_methods [{proposal_type "greedy", speculative_tokens, ...}], default_proposal_method, verifier
  {name_or_path, architectures}}, `transformer_layer_config` (the draft layers' transformers config, written by
  to_diff_dict, so absent keys are that class's defaults), `draft_vocab_size`, `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids` (the target hidden states entering those layers; default 2, L//2, L-3) and the
  norm flags norm_before_residual, norm_output (EAGLE 3.1), norm_before_fc and fc_norm.
- model.safetensors holds Eagle3DraftModel's state (speculators/models/eagle3/core.py): fc.weight, layers.<i>.*
  (layer 0 EAGLE-3's, model_definitions.py: q/k/v over cat(input_layernorm(embedding), hidden_norm(feature)) with the
  feature as residual), norm.weight, lm_head.weight, d2t (draft id i is target id i + d2t[i]), t2d (a bool per target
  id) and embed_tokens.weight (the verifier's).
That is SafeAILab's EAGLE-3 architecture, so a folder loads as an Eagle3Head and an Eagle3Head is written as one.
speculators 0.9 registers eagle3, peagle, dflash, dflash2, dspark, mtp and xpress models: it has no Medusa (nor
EAGLE-1) format, so Medusa heads have none to go to.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig

from specbench.errors import SpecbenchError
from specbench.files import write_atomic
from specbench.models.published.eagle import (Eagle3Head, check_embedding, draft_ids, eagle3_key, eagle3_layers)
from specbench.models.published.files import Published, check_base_model

log = logging.getLogger(__name__)
VERSION = "0.9.0"  # the speculators release whose format this module reads and writes
DRAFT_VOCAB_DEFAULT = 32000  # Eagle3SpeculatorConfig's draft_vocab_size when a config omits it
UNSUPPORTED = ("norm_before_fc", "fc_norm")  # norms over the fused features that Eagle3Head does not have
EXPORT_DTYPES = ("bfloat16", "float16", "float32")
EXPORT_FILES = ("config.json", "model.safetensors")  # what an export writes: the only files an earlier one leaves
EXPORT_MARK = {"written_by": "specbench task=export"}  # in the weights' metadata: an earlier export, safe to replace


def is_speculators(config: dict) -> bool:
    return "speculators_model_type" in config


def speculators_checkpoint(ckpt: Published, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) keyed as Eagle3Head, from a speculators eagle3 folder whose verifier is the target."""
    cfg, where = ckpt.config, f"speculators checkpoint '{ckpt.folder}'"
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise SpecbenchError(f"{where} holds a speculators '{kind}' model; method=eagle reads its 'eagle3' heads only")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict) or layer.get("model_type") != "llama":
        found = layer.get("model_type") if isinstance(layer, dict) else layer
        raise SpecbenchError(f"{where}: its transformer_layer_config has model_type {found!r}; specbench builds the "
                             f"EAGLE-3 draft layer from Llama's classes, so only 'llama' loads")
    flags = [k for k in UNSUPPORTED if cfg.get(k)] + [k for k in ("attention_bias", "mlp_bias") if layer.get(k)]
    if flags:
        raise SpecbenchError(f"{where} sets {', '.join(flags)}, which specbench's EAGLE-3 head does not implement "
                             f"(it has norm_before_residual and norm_output)")
    config = LlamaConfig(**{k: v for k, v in layer.items() if k != "transformers_version"})  # speculators' parse
    check_verifier(ckpt, cfg, config, target)
    raw = {k: v for k, v in ckpt.tensors().items() if not k.startswith("verifier_")}  # a trainer's frozen copies
    check_embedding(ckpt, raw.pop("embed_tokens.weight", None), target)
    draft_vocab, vocab = int(cfg.get("draft_vocab_size", DRAFT_VOCAB_DEFAULT)), int(config.vocab_size)
    norm_output = bool(cfg.get("norm_output", False))
    tensors = {eagle3_key(k, norm_output): v for k, v in raw.items() if k != "t2d"}
    tensors["d2t"] = draft_ids(ckpt, tensors.get("d2t"), raw.get("t2d"), draft_vocab, vocab)
    layers = feature_layers(ckpt, cfg.get("eagle_aux_hidden_state_layer_ids"), target)
    arch = {"layout": "eagle3", "feature_layers": list(layers), "draft_vocab": draft_vocab,
            "num_layers": int(config.num_hidden_layers), "norm_before_residual": bool(cfg.get("norm_before_residual")),
            "norm_output": norm_output, "config": {k: v for k, v in config.to_dict().items() if k != "dtype"}}
    log.info("speculators EAGLE-3 head %s (verifier %s)", ckpt.folder,
             (cfg.get("speculators_config") or {}).get("verifier", {}).get("name_or_path"))
    return {"format": "speculators", "layout": "eagle3", "method": "eagle", "source": str(ckpt.folder), "arch": arch,
            "metrics": {}}, tensors


def check_verifier(ckpt: Published, cfg: dict, layer: LlamaConfig, target) -> None:
    """The verifier speculators_config names must be the target: its name (by last path part, as for the papers'
    base_model_name_or_path), its architectures where both state them, and the hidden size and vocabulary the head
    was built for."""
    spec = cfg.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    if not isinstance(verifier, dict):
        raise SpecbenchError(f"speculators checkpoint '{ckpt.folder}' has no speculators_config.verifier (its "
                             f"name_or_path and architectures); it is not a speculators {VERSION} config")
    name, tcfg = verifier.get("name_or_path"), target.model.config
    hidden = cfg.get("target_hidden_size") or layer.hidden_size
    if (hidden, layer.hidden_size, layer.vocab_size) != (tcfg.hidden_size, tcfg.hidden_size, tcfg.vocab_size):
        raise SpecbenchError(f"speculators checkpoint '{ckpt.folder}' was built for verifier '{name}' with hidden size "
                             f"{hidden} (draft layer {layer.hidden_size}) and vocabulary {layer.vocab_size}, but the "
                             f"target '{target.name}' has {tcfg.hidden_size} and {tcfg.vocab_size}; load '{name}'")
    check_base_model(ckpt, name, target, field="speculators_config.verifier.name_or_path")
    theirs, ours = verifier.get("architectures") or [], architectures(target)
    if theirs and ours and not set(theirs) & set(ours):
        raise SpecbenchError(f"speculators checkpoint '{ckpt.folder}' was built for a {'/'.join(theirs)} verifier "
                             f"('{name}'), but the target '{target.name}' is a {'/'.join(ours)}; load '{name}'")


def architectures(target) -> list[str]:
    """The target's architectures as its config.json states them (a model built in-process: its class)."""
    return list(getattr(target.model.config, "architectures", None) or [type(target.model).__name__])


def feature_layers(ckpt: Published, ids, target) -> tuple[int, ...]:
    """The target hidden states the head fuses: eagle_aux_hidden_state_layer_ids (the states entering those layers,
    which are transformers' hidden_states indices too), or speculators' default 2, L//2, L-3."""
    num_layers = target.model.config.num_hidden_layers
    if ids is None:
        ids = eagle3_layers(num_layers)
        if len(ids) != 3:
            raise SpecbenchError(f"speculators checkpoint '{ckpt.folder}' fuses the inputs of layers 2, L//2 and "
                                 f"L-3, here only {len(ids)} distinct layers of the {num_layers}-layer target "
                                 f"'{target.name}': it was built for another verifier")
        return ids
    if (not isinstance(ids, list) or not ids or len(set(ids)) != len(ids)
            or not all(isinstance(i, int) and 0 <= i < num_layers for i in ids)):
        raise SpecbenchError(f"speculators checkpoint '{ckpt.folder}': eagle_aux_hidden_state_layer_ids={ids!r} must "
                             f"list distinct layers in 0..{num_layers - 1} of the target '{target.name}'")
    return tuple(ids)


def save_speculators(folder: str | Path, head, target, verifier: str, dtype: str = "bfloat16",
                     speculative_tokens: int = 3) -> Path:
    """Write an EAGLE-3 head as a speculators eagle3 folder: config.json naming the verifier, model.safetensors with
    the draft vocabulary sorted by target id (d2t offsets ascending, as speculators and the papers write them) and the
    target's embedding (speculators' own model reads embed_tokens from the checkpoint)."""
    if not isinstance(head, Eagle3Head):
        raise SpecbenchError("task=export writes EAGLE-3 heads (SafeAILab's midlayer architecture, which speculators, "
                             "vLLM and SGLang run); this checkpoint holds specbench's own EAGLE head (fc mixes feature "
                             "and embedding before a target-architecture layer), which they cannot: train one with "
                             "method.head=eagle3, or export a published EAGLE-3 folder")
    if dtype not in EXPORT_DTYPES:
        raise SpecbenchError(f"export.dtype={dtype!r} is invalid: use one of {', '.join(EXPORT_DTYPES)}")
    folder = Path(folder).expanduser()
    check_export_folder(folder)
    tcfg, cast = target.model.config, getattr(torch, dtype)
    layers, num_layers = list(head.layers), tcfg.num_hidden_layers
    if len(set(layers)) != len(layers) or not all(0 <= i < num_layers for i in layers):
        raise SpecbenchError(f"the head fuses the target's hidden states {layers}, but speculators' "
                             f"eagle_aux_hidden_state_layer_ids must be distinct layers in 0..{num_layers - 1} of the "
                             f"{num_layers}-layer target '{target.name}' (EAGLE-3 needs L >= 7 for 2, L//2, L-3)")
    d2t = head.d2t.detach().cpu().long()
    order = torch.argsort(d2t)
    ids, vocab = d2t[order], int(tcfg.vocab_size)
    tensors = {}
    for key, value in head.state_dict().items():
        if key == "d2t":
            continue
        value = value.detach().cpu()
        if key == "lm_head.proj.weight":
            value = value[order]
        tensors[_speculators_key(key)] = value.to(cast)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors |= {"d2t": ids - torch.arange(len(ids)), "t2d": t2d,
                "embed_tokens.weight": target.model.get_input_embeddings().weight.detach().cpu().to(cast)}
    layer = LlamaConfig(**{**head.body.config.to_dict(), "vocab_size": vocab, "architectures": None,
                           "bos_token_id": tcfg.bos_token_id, "eos_token_id": tcfg.eos_token_id})
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": architectures(target)},
        },
        "transformer_layer_config": layer.to_diff_dict(),
        "draft_vocab_size": len(ids),
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": layers,
        "norm_before_residual": head.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": head.norm_output,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "dtype": dtype,
        "transformers_version": transformers.__version__,
    }
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".model.", suffix=".safetensors.tmp")  # replaced whole, as below
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"format": "pt", **EXPORT_MARK})
        os.replace(tmp, folder / "model.safetensors")
    finally:
        Path(tmp).unlink(missing_ok=True)
    write_atomic(folder / "config.json", json.dumps(config, indent=2) + "\n")
    return folder


def check_export_folder(folder: Path, checkpoint: str | Path | None = None) -> None:
    """export.out, before anything loads: a folder to create, an empty one, or an earlier export (EXPORT_FILES, its
    weights marked as this function's), which is replaced; never the checkpoint being exported (a float32 head would
    become its bfloat16 copy) nor a folder holding other files (another checkpoint's config.json would be lost)."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise SpecbenchError(f"export.out='{folder}' is a file; give a folder to write config.json and "
                             f"model.safetensors into")
    source = Path(checkpoint).expanduser().resolve() if checkpoint else None
    if source is not None and (source == folder.resolve() or folder.resolve() in source.parents):
        raise SpecbenchError(f"export.out='{folder}' holds method.checkpoint='{checkpoint}', the head being exported, "
                             f"which the export would replace: give export.out a new or empty folder")
    files = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if files and not (set(files) <= set(EXPORT_FILES) and _exported(folder / "model.safetensors")):
        shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
        raise SpecbenchError(f"export.out='{folder}' already holds {shown}, which an export (config.json, "
                             f"model.safetensors) would replace or mix with: give export.out a new or empty folder "
                             f"(an earlier export there is replaced)")


def _exported(path: Path) -> bool:
    """Whether the weights file is one save_speculators wrote (its safetensors metadata says so)."""
    try:
        with safe_open(str(path), "pt") as fh:
            return (fh.metadata() or {}).items() >= EXPORT_MARK.items()
    except Exception:  # noqa: BLE001  (absent, cut short or no safetensors at all: not an export of ours)
        return False


def _speculators_key(key: str) -> str:
    """An Eagle3Head tensor's key in speculators' Eagle3DraftModel (eagle3_key's inverse)."""
    if key.startswith("body.layers."):
        return key.removeprefix("body.")
    return {"body.norm.weight": "norm.weight", "lm_head.norm.weight": "norm.weight",
            "lm_head.proj.weight": "lm_head.weight"}.get(key, key)
