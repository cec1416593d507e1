"""Medusa heads in FasterDecoding's layout, mapped onto specbench's MedusaHeads (untied: each head its own projection).

Read from FasterDecoding/Medusa, medusa/model/medusa_model.py: `medusa_head` is a ModuleList of one
`nn.Sequential(*[ResBlock] * medusa_num_layers, nn.Linear(hidden, vocab, bias=False))` per head, so a state dict
holds `{head}.{block}.linear.weight|bias` and `{head}.{medusa_num_layers}.weight`; a Medusa-2 folder is the whole tuned
model with the same keys under `medusa_head.`. The repeated ResBlock is one module (its blocks share weights), which
the state dict stores once per block: loading every block's copy computes the same thing.
"""

from __future__ import annotations

import logging
import re

import torch

from specbench.errors import SpecbenchError
from specbench.models.published.files import Published

log = logging.getLogger(__name__)
KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def medusa_checkpoint(ckpt: Published, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) keyed as specbench.drafters.medusa.MedusaHeads(tie_lm_head=False)."""
    heads_only = ckpt.weights[0].name.startswith("medusa_lm_head")
    raw = ckpt.tensors() if heads_only else ckpt.tensors("medusa_head.")  # Medusa-2: the heads inside the model
    layers = ckpt.config.get("medusa_num_layers", 1)
    parsed = [(KEY.match(k), k) for k in raw]
    bad = [k for m, k in parsed if m is None]
    heads = sorted({int(m.group(1)) for m, _ in parsed if m})
    if bad or not heads or heads != list(range(len(heads))):
        raise SpecbenchError(f"checkpoint '{ckpt.folder}' is not in Medusa's layout: expected keys "
                             f"'<head>.<block>.linear.weight' and '<head>.{layers}.weight' for heads 0..K-1, found "
                             f"{(bad or sorted(raw))[:3]}")
    tensors: dict[str, torch.Tensor] = {}
    for h in heads:
        need = [f"{h}.{b}.linear.{p}" for b in range(layers) for p in ("weight", "bias")] + [f"{h}.{layers}.weight"]
        missing = [k for k in need if k not in raw]
        if missing or any(int(m.group(2)) > layers for m, _ in parsed if m and int(m.group(1)) == h):
            raise SpecbenchError(f"checkpoint '{ckpt.folder}' does not match its config's medusa_num_layers="
                                 f"{layers}: head {h} lacks {missing[:2]} or has more blocks; fix config.json")
        for b in range(layers):
            for p in ("weight", "bias"):
                tensors[f"blocks.{h}.{b}.linear.{p}"] = raw[f"{h}.{b}.linear.{p}"]
        tensors[f"proj.{h}.weight"] = raw[f"{h}.{layers}.weight"]
    vocab, hidden = tensors["proj.0.weight"].shape
    cfg = target.model.config
    base = ckpt.config.get("base_model_name_or_path", "unknown")
    if (hidden, vocab) != (cfg.hidden_size, cfg.vocab_size):
        raise SpecbenchError(f"checkpoint '{ckpt.folder}' holds Medusa heads for hidden size {hidden} and "
                             f"vocabulary {vocab} (base model '{base}'), but the target '{target.name}' has "
                             f"{cfg.hidden_size} and {cfg.vocab_size}; load the base model it was trained for")
    stated = ckpt.config.get("medusa_num_heads")
    if stated != len(heads):  # FasterDecoding's own loader overrides the uploaded count the same way
        log.info("Medusa checkpoint %s: config.json says %s heads, its weights hold %d; using %d",
                 ckpt.folder, stated, len(heads), len(heads))
    arch = {"hidden_size": hidden, "vocab_size": vocab, "num_heads": len(heads), "num_layers": layers,
            "tie_lm_head": False}
    log.info("published Medusa heads %s: %d heads x %d blocks, base model %s", ckpt.folder, len(heads), layers, base)
    return {"format": "published", "layout": "medusa", "method": "medusa", "source": str(ckpt.folder),
            "base_model": base, "arch": arch, "metrics": {}}, tensors
