"""An EAGLE head run by OpenVINO as one call per tree level (Drafter.on_openvino).

Why: eager PyTorch runs the head's fc, decoder layer and draft LM head as about ten small kernels, each paying
dispatch and reading float32 weights, so drafting a chain of two cost a fifth of an int8 verify step
(experiments/openvino_engine_speed). Here the head is an IR of the verify's own layout (export.INPUTS in; logits, the
output feature and the new rows' keys and values out), weights in int8, run by OpenVinoForward with its own cache
buffer, row models and static models, as the target is. A step's first call, over the committed rows, takes the
target's features unfused: a second IR of the same head fuses them first, on the same cache buffer, so the fuse is no
call of its own. It only drafts: the verify decides every token, so a run stays lossless.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError
from specbench.execution.openvino.attention import ATTENTION, register
from specbench.execution.openvino.compile import PROPERTIES, StaticModels, compiled, row_models
from specbench.execution.openvino.export import (INPUTS, flat_cache, interrupt_after, ir_folder, quiet_transformers,
                                                save_ir, usable)
from specbench.execution.cache_views import CacheBuffers
from specbench.execution.openvino.forward import OpenVinoForward
from specbench.models.loading import LoadedModel
from specbench.models.shape import head_dim


class _HeadGraph(nn.Module):
    """The forward the head's IR holds: the rows' features and next-token embeddings side by side (one input, as
    OpenVinoForward feeds a target's embeddings), the mask, positions and the head's cached keys and values in; the
    draft logits of `logits_rows`, the output feature of `hidden_rows` (one "layer") and the new rows' keys and values
    out. The head's attention is the verify's split_attention: the cache is read where it lies. With `fuses` the
    features are the target's (EAGLE-3's low, mid and high layers side by side), fused by the head first."""

    def __init__(self, head: nn.Module, fuses: bool = False) -> None:
        super().__init__()
        self.head, self.config, self.fuses = head, head.body.config, fuses
        self.generation_config = None  # OpenVinoForward reads it; a head generates nothing itself
        self.feature_width = head.fuse.in_features if fuses else self.config.hidden_size

    def get_input_embeddings(self) -> nn.Module:
        """The head embeds no token (the drafter hands it the target's embeddings): its fc stands in where
        OpenVinoForward asks for the module that owns the inputs' device."""
        return self.head.fc

    def forward(self, inputs_embeds, attention_mask, position_ids, past, logits_rows, hidden_rows):
        features, embeds = inputs_embeds[..., :self.feature_width], inputs_embeds[..., self.feature_width:]
        if self.fuses:
            features = self.head.fuse(features)
        layers = past.unbind(0)
        cache = flat_cache(self.config, [t[:, :, :0] for t in layers])
        out = self.head(features, embeds, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, cached_kv=layers)
        new = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return self.head.lm_head(out.index_select(1, logits_rows)), out[None].index_select(2, hidden_rows), \
            torch.stack(new)


@contextlib.contextmanager
def _attention(head: nn.Module, layout: str):
    """Every config in `head` set to attention `layout` while it is traced: a published head's attention layer may
    hold a config of its own beside its body's."""
    configs = {id(m.config): m.config for m in head.modules() if hasattr(m, "config")}.values()
    before = [c._attn_implementation for c in configs]
    register(layout)
    for config in configs:
        config._attn_implementation = layout
    try:
        yield
    finally:
        for config, attention in zip(configs, before):
            config._attn_implementation = attention


def _export(graph: _HeadGraph, folder: Path) -> None:
    """The head's IR in int8 weights, saved into `folder` whole."""
    import openvino as ov

    config = graph.config
    kv_heads, layers, width = config.num_key_value_heads, config.num_hidden_layers, head_dim(config)
    inputs = graph.feature_width + config.hidden_size
    n, past = 3, 2
    example = (torch.zeros(1, n, inputs), torch.ones(n, past + n, dtype=torch.bool).tril(past)[None, None],
               torch.arange(past, past + n)[None], torch.zeros(2 * layers, 1, kv_heads, past, width),
               torch.arange(n), torch.arange(n))
    try:
        with _attention(graph.head, ATTENTION), torch.no_grad(), warnings.catch_warnings(), quiet_transformers(), \
                interrupt_after("conversion of the EAGLE head"):
            warnings.simplefilter("ignore")
            ir = ov.convert_model(graph, example_input=example)
    except Exception as exc:  # noqa: BLE001  (the frontend raises its own types)
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise SpecbenchError(f"model.backend=openvino cannot export this EAGLE head: openvino.convert_model failed: "
                             f"{lines[-1][:200] if lines else type(exc).__name__}") from exc
    shapes = [[-1, -1, inputs], [-1, 1, -1, -1], [-1, -1], [2 * layers, -1, kv_heads, -1, width], [-1], [-1]]
    save_ir(ir, dict(zip(INPUTS, shapes)), "int8", folder)


class OpenVinoEagleHead(nn.Module):
    """An EAGLE head (EagleHead or a published one: anything with fuse, fc, body and lm_head) whose forward and draft
    LM head are one OpenVINO call (`draft`), the committed rows' call fusing the target's features in it too. The
    float head stays as `source`: its weights are what parameters() counts."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.source = head
        head = head.float().eval()  # an openvino run's activations are float32: a no-op there
        self.levels = _forward(_HeadGraph(head), "draft-int8")
        self.committed = _forward(_HeadGraph(head, fuses=True), "draft-root-int8", self.levels.buffers) \
            if isinstance(head.fuse, nn.Linear) else self.levels

    @property
    def fc(self) -> nn.Module:
        """The float head's fc: callers read the dtype its inputs are cast to from its weight."""
        return self.source.fc

    def draft(self, features: torch.Tensor, embeds: torch.Tensor, attention_mask=None, position_ids=None,
              past_key_values=None, committed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's output feature and draft logits, from one call; the head's cache grows by the rows. The features
        are the head's own (a tree level's parents), or with `committed` the target's, unfused."""
        forward = self.committed if committed else self.levels
        out = forward(inputs_embeds=torch.cat([features.float(), embeds.float()], dim=-1),
                      attention_mask=attention_mask, position_ids=position_ids, past_key_values=past_key_values,
                      output_hidden_states=True)
        return out.hidden_states[-1], out.logits

    def compile_ahead(self, shortest: int, longest: int) -> None:
        """Both IRs' static models for a draft cache of `shortest` to `longest` rows (OpenVinoForward.compile_ahead,
        which compiles nothing twice: a head without a fuse runs one IR as both)."""
        for forward in (self.levels, self.committed):
            forward.compile_ahead(shortest, longest)


def _forward(graph: _HeadGraph, kind: str, buffers: CacheBuffers | None = None) -> OpenVinoForward:
    """`graph`'s IR (exported once per machine) run as the target's is: row models, static models as a run meets
    their sizes, and `buffers` where a cache is shared with another IR of the head."""
    folder = ir_folder(LoadedModel("eagle_head", graph, tokenizer=None, source="an EAGLE head"), kind, ATTENTION)
    if not usable(folder):
        _export(graph, folder)
    xml = str(folder / "openvino_model.xml")
    return OpenVinoForward(graph, compiled(xml, PROPERTIES), row_models(xml, PROPERTIES),
                           static=StaticModels(xml, PROPERTIES), buffers=buffers)
