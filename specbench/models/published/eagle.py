"""EAGLE and EAGLE-3 draft heads in SafeAILab/EAGLE's layout, built from transformers' Llama classes.

Read from SafeAILab/EAGLE (no code copied):
- EAGLE-1/EAGLE-2 (eagle/model/cnets1.py `Model`): fc = Linear(2d, d, bias=config.bias, default true) over
  cat(token embedding, target feature), `num_hidden_layers` Llama decoder layers of which the first has no
  input_layernorm, no final norm, and the target's own LM head; the feature is the target's last (normed) hidden
  state. Keys: fc.*, layers.<i>.*, embed_tokens.weight (a copy of the target's).
- EAGLE-3 (eagle/model/cnets.py `Model`): fc = Linear(3d, d, bias=False) fuses the target's hidden states entering
  layers 2, L//2 and L-3 (its modeling_llama_kv.py collects them in that loop order); one `midlayer` whose attention
  reads cat(input_layernorm(embedding), hidden_norm(feature)) (q/k/v projections take 2d inputs) with the feature as
  the residual, then the MLP; lm_head(norm(out)) over draft_vocab_size tokens, draft id i being target id i + d2t[i];
  deeper draft rows read `out` before the norm. Keys: fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d,
  and sometimes embed_tokens.weight.
Both heads answer specbench's EagleHead interface (layers, fuse, fc, forward(features, embeds, ...), lm_head, d2t), so
EagleDrafter drafts with them under any of its trees. A LlamaModel with one layer slot does the rotary embedding, the
4D tree mask and the KV cache; EAGLE-3's layer is composed of transformers' LlamaAttention (its q/k/v swapped for
2d-input projections), LlamaMLP and LlamaRMSNorm rather than forking a decoder layer.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from transformers import AutoModel, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

from specbench.errors import SpecbenchError
from specbench.models.published.files import LAYOUTS, Published, check_base_model

log = logging.getLogger(__name__)
SKIP = ("architectures", "torch_dtype", "dtype", "transformers_version", "auto_map", "_name_or_path")


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """Hidden-state indices EAGLE-3 fuses: the inputs of layers 2, L//2 and L-3, in layer order."""
    return tuple(i for i in range(num_layers) if i in (2, num_layers // 2, num_layers - 3))


def draft_config(cfg: dict, num_layers: int) -> LlamaConfig:
    """The draft layer's Llama config: the published config.json's shapes, no embedding of its own."""
    kwargs = {k: v for k, v in cfg.items() if k not in SKIP}
    scaling = kwargs.pop("rope_scaling", None)
    if scaling and (scaling.get("type") or scaling.get("rope_type")) != "linear":
        raise SpecbenchError(f"EAGLE config rope_scaling={scaling!r} is not supported: EAGLE's own layer applies "
                             f"none or linear scaling")
    kwargs.update(num_hidden_layers=num_layers, vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
    return LlamaConfig(rope_scaling=scaling or None, **kwargs)


LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps", "hidden_act", "max_position_embeddings", "rope_parameters")


def eagle3_config_for(config) -> dict:
    """The draft layer's config (as a config.json states it, for draft_config) of an EAGLE-3 head trained here for
    a target: the target's own shapes, norm epsilon and rotary embedding, on Llama's classes (a target with one
    rotary per attention type lends its full attention's)."""
    cfg = config.to_dict()
    layer = {"model_type": "llama", **{k: cfg[k] for k in LAYER_KEYS if cfg.get(k) is not None}}
    rope = layer.get("rope_parameters")
    if rope and "rope_type" not in rope:
        layer["rope_parameters"] = rope.get("full_attention")
    return layer


class Eagle3Layer(nn.Module):
    """EAGLE-3's midlayer. Its input is cat(embedding, feature) on the last axis (the body's single input), its
    residual the feature (speculators' norm_before_residual: the normed feature); it returns the new feature."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False) -> None:
        super().__init__()
        d = config.hidden_size
        self.norm_before_residual = norm_before_residual
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # the attention reads the 2d-wide concatenation
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * d, old.out_features, bias=False))
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_embeddings=None, **kwargs):
        embeds, feature = hidden_states.chunk(2, dim=-1)
        normed = self.hidden_norm(feature)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attn, _ = self.self_attn(hidden_states=x, attention_mask=attention_mask,
                                 position_embeddings=position_embeddings, **kwargs)
        feature = (normed if self.norm_before_residual else feature) + attn
        return feature + self.mlp(self.post_attention_layernorm(feature))


def _body(config: LlamaConfig) -> nn.Module:
    """transformers' LlamaModel without embedding or final norm: rotary, masks and cache for the draft layers."""
    body = AutoModel.from_config(config)
    body.embed_tokens, body.norm = None, nn.Identity()
    return body


class Eagle1Head(nn.Module):
    def __init__(self, config: LlamaConfig, lm_head: nn.Module, bias: bool) -> None:
        super().__init__()
        d = config.hidden_size
        self.layers = (-1,)  # the target's last hidden state, after its final norm
        self.fuse = nn.Identity()
        self.fc = nn.Linear(2 * d, d, bias=bias)
        self.body = _body(config)
        self.body.layers[0].input_layernorm = nn.Identity()  # EAGLE's first draft layer has none
        self._lm_head = (lm_head,)  # the target's, shared: not a parameter of the head
        self.register_buffer("d2t", torch.arange(lm_head.weight.shape[0]))

    @property
    def lm_head(self) -> nn.Module:
        return self._lm_head[0]

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, **body_kwargs) -> torch.Tensor:
        x = self.fc(torch.cat([embeds.to(features.dtype), features], dim=-1))
        return self.body(inputs_embeds=x, use_cache=True, **body_kwargs).last_hidden_state


class Eagle3Head(nn.Module):
    """EAGLE-3's head: fc, the midlayer (then config.num_hidden_layers - 1 plain Llama layers, as speculators allows),
    norm, lm_head. Deeper rows read the output before the norm, or after it under speculators' norm_output (EAGLE
    3.1), where the norm moves into the body."""

    def __init__(self, config: LlamaConfig, layers: tuple[int, ...], draft_vocab: int,
                 norm_before_residual: bool = False, norm_output: bool = False) -> None:
        super().__init__()
        d = config.hidden_size
        self.layers = layers
        self.norm_before_residual, self.norm_output = norm_before_residual, norm_output
        self.fc = nn.Linear(len(layers) * d, d, bias=False)  # fuses the target's features (EAGLE-3's own name)
        self.body = _body(config)
        self.body.layers[0] = Eagle3Layer(config, norm_before_residual)
        norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.lm_head = nn.Sequential()  # norm, then the draft-vocabulary projection
        if norm_output:
            self.body.norm = norm
        else:
            self.lm_head.add_module("norm", norm)
        self.lm_head.add_module("proj", nn.Linear(d, draft_vocab, bias=False))
        self.register_buffer("d2t", torch.arange(draft_vocab))

    @property
    def fuse(self) -> nn.Module:
        return self.fc

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, **body_kwargs) -> torch.Tensor:
        x = torch.cat([embeds.to(features.dtype), features], dim=-1)
        return self.body(inputs_embeds=x, use_cache=True, **body_kwargs).last_hidden_state


def eagle_checkpoint(ckpt: Published, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) keyed as Eagle1Head or Eagle3Head; metadata's arch says which (`layout`)."""
    cfg, tcfg, keys = ckpt.config, target.model.config, ckpt.keys()
    eagle3 = any(k.startswith("midlayer.") for k in keys)
    if "fc.weight" not in keys or not (eagle3 or any(k.startswith("layers.") for k in keys)):
        raise SpecbenchError(f"checkpoint '{ckpt.folder}' has a config.json but no EAGLE draft weights (fc.weight "
                             f"with layers.* or midlayer.*; found {sorted(keys)[:3]}); published layouts: {LAYOUTS}")
    hidden, vocab = cfg.get("hidden_size"), cfg.get("vocab_size")
    if (hidden, vocab) != (tcfg.hidden_size, tcfg.vocab_size) or cfg.get("target_hidden_size", hidden) != hidden:
        raise SpecbenchError(f"EAGLE checkpoint '{ckpt.folder}' was trained for hidden size {hidden} and vocabulary "
                             f"{vocab}, but the target '{target.name}' has {tcfg.hidden_size} and {tcfg.vocab_size}; "
                             f"load the base model it was trained for")
    check_base_model(ckpt, cfg.get("base_model_name_or_path"), target)
    raw = ckpt.tensors()
    check_embedding(ckpt, raw.pop("embed_tokens.weight", None), target)
    if eagle3:
        layers = eagle3_layers(tcfg.num_hidden_layers)
        if len(layers) != 3:
            raise SpecbenchError(f"EAGLE-3 fuses the inputs of layers 2, L//2 and L-3, here only {len(layers)} "
                                 f"distinct layers of the {tcfg.num_hidden_layers}-layer target '{target.name}': "
                                 f"checkpoint '{ckpt.folder}' was trained for another base model")
        draft_vocab = int(cfg.get("draft_vocab_size", vocab))
        tensors = {eagle3_key(k): v for k, v in raw.items() if k != "t2d"}
        tensors["d2t"] = draft_ids(ckpt, tensors.get("d2t"), raw.get("t2d"), draft_vocab, vocab)
        arch = {"layout": "eagle3", "feature_layers": list(layers), "draft_vocab": draft_vocab}
    else:
        tensors = {("body." + k if k.startswith("layers.") else k): v for k, v in raw.items()}
        tensors["d2t"] = torch.arange(vocab)
        arch = {"layout": "eagle1", "feature_layers": [-1], "draft_vocab": vocab, "bias": "fc.bias" in raw,
                "num_layers": int(cfg.get("num_hidden_layers", 1))}
    log.info("published %s head %s", "EAGLE-3" if eagle3 else "EAGLE", ckpt.folder)
    return {"format": "published", "layout": arch["layout"], "method": "eagle", "source": str(ckpt.folder),
            "arch": arch | {"config": cfg}, "metrics": {}}, tensors


def draft_ids(ckpt: Published, offsets, t2d, draft_vocab: int, vocab: int) -> torch.Tensor:
    """EAGLE-3's d2t (draft id i -> target id i + d2t[i]) as target ids, checked both ways against t2d (one flag per
    target id: in the draft vocabulary or not): draft_vocab distinct ids in 0..vocab-1, exactly the ids t2d flags."""
    where = f"EAGLE-3 checkpoint '{ckpt.folder}'"
    if offsets is None:
        offsets = torch.zeros(draft_vocab, dtype=torch.long)
    if offsets.ndim != 1 or offsets.numel() != draft_vocab or offsets.is_floating_point():
        raise SpecbenchError(f"{where}: its d2t is a {offsets.dtype} tensor of shape {tuple(offsets.shape)}, but its "
                             f"config's draft_vocab_size={draft_vocab} needs one integer offset per draft id")
    ids = torch.arange(draft_vocab) + offsets.long()
    low, high, distinct = int(ids.min()), int(ids.max()), len(torch.unique(ids))
    if low < 0 or high >= vocab or distinct != draft_vocab:
        raise SpecbenchError(f"{where}: its d2t map sends the {draft_vocab} draft ids to target ids {low}..{high} "
                             f"({distinct} distinct); each must be a distinct id in 0..{vocab - 1} (the target's "
                             f"vocabulary)")
    if t2d is not None:
        if t2d.ndim != 1 or t2d.numel() != vocab:
            raise SpecbenchError(f"{where}: its t2d has shape {tuple(t2d.shape)}, but the target's vocabulary needs "
                                 f"one flag per token ({vocab},)")
        if t2d.is_floating_point() or not bool(((t2d == 0) | (t2d == 1)).all()):
            raise SpecbenchError(f"{where}: its t2d holds values {sorted(set(t2d.unique().tolist()))[:4]}, but it "
                                 f"must flag each target id with 0 or 1 (in the draft vocabulary or not)")
        flagged = t2d.bool()
        missing = ids[~flagged[ids]]
        if int(flagged.sum()) != draft_vocab or len(missing):
            raise SpecbenchError(f"{where}: its t2d flags {int(flagged.sum())} target ids, {len(missing)} of d2t's "
                                 f"{draft_vocab} not among them (e.g. {missing[:3].tolist()}); t2d must flag exactly "
                                 f"the target ids d2t maps to")
    return ids


def eagle3_key(key: str, norm_output: bool = False) -> str:
    """A published EAGLE-3 tensor's key in Eagle3Head (SafeAILab's midlayer.*, speculators' layers.<i>.*)."""
    if key.startswith("midlayer."):
        return "body.layers.0." + key.removeprefix("midlayer.")
    if key.startswith("layers."):
        return "body." + key
    norm = "body.norm.weight" if norm_output else "lm_head.norm.weight"
    return {"norm.weight": norm, "lm_head.weight": "lm_head.proj.weight"}.get(key, key)


def check_embedding(ckpt: Published, embed: torch.Tensor | None, target) -> None:
    """EAGLE's embedding is a frozen copy of its base model's: a different one means another base model (quantised
    targets differ a little, another model's embedding entirely)."""
    if embed is None:
        return
    ours = target.model.get_input_embeddings().weight.detach().float().cpu()
    if embed.shape != ours.shape or (embed.float() - ours).norm() > 0.25 * ours.norm():
        raise SpecbenchError(f"EAGLE checkpoint '{ckpt.folder}' carries the token embedding of another base model "
                             f"than the target '{target.name}'; load the base model it was trained for")


def published_eagle_head(target, meta: dict, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """The head a published EAGLE checkpoint describes, its weights loaded, on the target's device and dtype."""
    arch = meta["arch"]
    if arch["layout"] == "eagle3":
        head = Eagle3Head(draft_config(arch["config"], arch.get("num_layers", 1)), tuple(arch["feature_layers"]),
                          arch["draft_vocab"], arch.get("norm_before_residual", False), arch.get("norm_output", False))
    else:
        head = Eagle1Head(draft_config(arch["config"], arch["num_layers"]), target.model.get_output_embeddings(),
                          arch["bias"])
    try:
        head.load_state_dict(tensors)
    except RuntimeError as exc:
        detail = " ".join(line.strip() for line in str(exc).splitlines())[:300]
        raise SpecbenchError(f"checkpoint '{meta.get('source', 'the artifact')}' does not hold the "
                             f"{arch['layout']} head its config describes ({detail})") from exc
    return head.to(device=target.model.device, dtype=target.model.dtype).eval()
