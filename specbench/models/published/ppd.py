"""PPD prompt tokens in the layout of hmarkc/parallel-prompt-decoding, mapped onto specbench's PromptTokens.

Read from prompt/model/model.py there: `PromptDecoder` is a peft prompt-tuning model, so its folder holds
adapter_config.json (PromptConfig: num_special_tokens m, virtual_tokens_per_special_token n_e, vt_attention_type,
aggregation_type, use_custom_lm_head, use_prefix_tuning, num_exits) and adapter_model.safetensors|.bin with
`prompt_embeddings` of shape (m * n_e, d), row i * n_e + j being special token i's ensemble member j. Member j's
tokens form a causal chain (the `ensemble` attention mask), special token i sits at position len + i, and the logits
of a special token's members are averaged (`mean` aggregation): what specbench's PPD drafter computes. Other
options (custom LM head, prefix tuning, weighted aggregation, several exits) change the forward and are refused.
"""

from __future__ import annotations

import logging

import torch

from specbench.errors import SpecbenchError
from specbench.models.published.files import Published, check_base_model

log = logging.getLogger(__name__)


def ppd_checkpoint(ckpt: Published, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) keyed as specbench.drafters.ppd.PromptTokens."""
    cfg = ckpt.config
    m, n_e = cfg["num_special_tokens"], cfg.get("virtual_tokens_per_special_token", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (m, n_e)):
        raise SpecbenchError(f"PPD checkpoint '{ckpt.folder}' has num_special_tokens={m!r} and "
                             f"virtual_tokens_per_special_token={n_e!r} in adapter_config.json; both must be integers "
                             f">= 1")
    attention = str(cfg.get("vt_attention_type", "decoder")).lower()
    unsupported = [f"{key}={cfg[key]!r}" for key, ok in (("use_custom_lm_head", False), ("use_prefix_tuning", False),
                                                         ("num_exits", 1), ("aggregation_type", "mean"))
                   if key in cfg and str(cfg[key]).lower() != str(ok).lower()]
    if attention not in (("ensemble",) if n_e > 1 else ("ensemble", "decoder")):
        unsupported.append(f"vt_attention_type={attention!r} with {n_e} member(s)")
    if unsupported:
        raise SpecbenchError(f"PPD checkpoint '{ckpt.folder}' uses {', '.join(unsupported)}, which specbench's PPD "
                             f"drafter does not compute; it runs mean-aggregated prompt tokens in causal chains "
                             f"(ensemble, or decoder with one member) on the target's own LM head")
    tensors = ckpt.tensors()
    if "prompt_embeddings" not in tensors:
        raise SpecbenchError(f"PPD checkpoint '{ckpt.folder}' holds no 'prompt_embeddings' (found "
                             f"{sorted(tensors)[:3]}); expected peft's prompt-tuning adapter weights")
    embeds = tensors["prompt_embeddings"]
    hidden = target.model.config.hidden_size
    base = cfg.get("base_model_name_or_path", "unknown")
    if embeds.ndim != 2 or embeds.shape[0] != m * n_e or embeds.shape[1] != hidden:
        raise SpecbenchError(f"PPD checkpoint '{ckpt.folder}' holds prompt embeddings of shape {tuple(embeds.shape)} "
                             f"(base model '{base}'), but {m} special tokens x {n_e} members for the target "
                             f"'{target.name}' need ({m * n_e}, {hidden}); load the base model it was trained for")
    check_base_model(ckpt, base, target)
    arch = {"num_prompt_tokens": m, "num_ensemble": n_e, "hidden_size": hidden}
    log.info("published PPD prompt tokens %s: %d tokens x %d members, base model %s", ckpt.folder, m, n_e, base)
    return {"format": "published", "layout": "ppd", "method": "ppd", "source": str(ckpt.folder), "base_model": base,
            "arch": arch, "metrics": {}}, {"weight": embeds.reshape(m, n_e, hidden)}
