"""Medusa heads in FasterDecoding's layout, mapped onto specbench's MedusaHeads (untied: each head its own projection).

Read from FasterDecoding/Medusa, medusa/model/medusa_model.py: `medusa_head` is a ModuleList of one
`nn.Sequential(*[ResBlock] * medusa_num_layers, nn.Linear(hidden, vocab, bias=False))` per head, so a state dict
holds `{head}.{block}.linear.weight|bias` and `{head}.{medusa_num_layers}.weight`; a Medusa-2 folder is the whole tuned
model with the same keys under `medusa_head.`. The repeated ResBlock is one module (its blocks share weights), which
the state dict stores once per block: loading every block's copy computes the same thing.

The heads must be the target's: a heads-only folder's config names its base model (base_model_name_or_path), which
must be the target; a Medusa-2 folder's heads were tuned with the model it holds, so its LM head must be the target's
(load the folder itself as the model). Uploaded configs state fewer heads than their weights hold (FasterDecoding's
own loader overrides the count with 5), so the weights' count is the checkpoint's.
"""

from __future__ import annotations

import logging
import re

import torch

from specbench.errors import SpecbenchError
from specbench.models.published.files import Published, check_base_model

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
    if heads_only:
        check_base_model(ckpt, base, target)
    else:
        _check_backbone(ckpt, target)
    stated = ckpt.config.get("medusa_num_heads")
    if isinstance(stated, int) and stated > len(heads):
        raise SpecbenchError(f"checkpoint '{ckpt.folder}' states medusa_num_heads={stated} in its config.json, but its "
                             f"weights hold {len(heads)} heads (0..{len(heads) - 1}): the folder is incomplete; give "
                             f"the whole weights file, or set medusa_num_heads to {len(heads)}")
    if stated != len(heads):  # FasterDecoding's own loader overrides the uploaded count the same way
        log.info("Medusa checkpoint %s: config.json says %s heads, its weights hold %d; using %d",
                 ckpt.folder, stated, len(heads), len(heads))
    arch = {"hidden_size": hidden, "vocab_size": vocab, "num_heads": len(heads), "num_layers": layers,
            "tie_lm_head": False}
    log.info("published Medusa heads %s: %d heads x %d blocks, base model %s", ckpt.folder, len(heads), layers, base)
    return {"format": "published", "layout": "medusa", "method": "medusa", "source": str(ckpt.folder),
            "base_model": base, "arch": arch, "metrics": {}}, tensors


def _check_backbone(ckpt: Published, target) -> None:
    """A Medusa-2 folder is the tuned model its heads were trained with: its token embedding must be the target's (a
    quantised target's differs a little, another model's entirely)."""
    ours = target.model.get_input_embeddings().weight.detach().float().cpu()
    theirs = ckpt.tensors("model.embed_tokens.weight").get("")
    if theirs is None:
        found = "it holds no model.embed_tokens.weight"
    elif theirs.shape != ours.shape or (theirs.float() - ours).norm() > 0.25 * ours.norm():
        found = f"its token embedding {tuple(theirs.shape)} is not the target '{target.name}''s {tuple(ours.shape)}"
    else:
        return
    raise SpecbenchError(f"checkpoint '{ckpt.folder}' is a Medusa-2 model (its heads tuned with the model it holds), "
                         f"but {found}; load the folder itself as the model (model=hf model.path={ckpt.folder})")
