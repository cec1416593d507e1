"""The `openvino` backend: the target's forward run by OpenVINO's CPU runtime, the cache and the loop left as they are.

Why: a 135M model's eager PyTorch forward is mostly dispatch, and its cost grows with the rows of a verify (SmolLM2
int4 on a 2-core Cascade Lake: 37 ms for one row, 61 for eight, 82 for sixteen), where OpenVINO's runtime runs the
same layers as a few fused kernels (this IR, int4_g64: 22.3, 46.5 and 47.2 ms in the machine profile of
experiments/openvino_same_model). Compiling one graph ahead of time is what the deployment engines do; here it serves
every method's verify.

The IR is stateless, so nothing of transformers' cache or of the methods changes: the model is traced by
`openvino.convert_model` with its inputs as the verify gives them -- input embeddings (the embedding lookup stays in
PyTorch, so PPD's prompt-token embeddings pass through it too), a 4D boolean mask (a tree's, or the causal one),
position ids and every layer's cached keys and values -- and its outputs are the logits, every hidden state (EAGLE and
Medusa read them) and only the new rows' keys and values, which the adapter appends to the run's own DynamicCache (so
cropping and committing a path work unchanged). Inside the graph the attention reads the cached keys where they lie
and the new rows as a second block (split_attention), so no call copies the cache. A batch-1 call of a few rows runs a
copy compiled for a static shape, its rows and cache padded up to it (STATIC_ROWS: a dynamic shape costs the CPU plugin
~8 ms a call), and the cache's layers then stay views of that copy's input memory. Weights: `fp` keeps the float32
weights; `int8` and `int4_g<group>` are compressed by NNCF (int8 symmetric per output channel; int4 asymmetric in
groups, NNCF's grid with an integer zero point, which is not aten's grid of execution/quantize.py: an openvino int4
target is a target of its own); `w4a8_g<group>` is that int4 IR run with its activations quantised on the fly
(PROPERTIES says why apart), and `w4a8r_g<group>` runs it row-invariant, a lossless verify target: every call of two
rows or more and an attention whose sums run in an order fixed by each row's position (recent_attention), so a tree
verify computes every row as plain decoding does, bitwise. The IR is cached under the specbench cache, keyed by the
model, the versions that shape it and the attention it traces; OpenVINO's compiled blobs too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import logging
import math
import os
import shutil
import sys
import time
import warnings
import weakref
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import AttentionInterface

from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel, cache_dir, with_dtype
from specbench.models.shape import head_dim, linear_input_widths

INSTALL = "pip install -e '.[engines]'"
# the attention the exported forward runs (split_attention), registered with transformers under this name; a new IR
# layout changes the name, which keys the IR cache (ir_folder), so an IR exported before is not read as this one
ATTENTION = "specbench_split_v1"
# float32 activations, never quantised on the fly: with OpenVINO's default dynamic quantisation (activations to int8 in
# groups of 32 before an int4 or int8 FC) a 16-row verify of SmolLM2 int4_g64 gave logits up to 0.84 away from the same
# 16 one-token forwards, and speculation kept 5 of 20 answers of the backend's own plain decoding; without it 5.7e-5
# (float sums in another order, the near-ties the lossless column still checks) and 20 of 20. Verifying in pieces of
# the rows it keeps equal does not hold it either: with it on, the largest row count whose rows equal their one-row
# forwards bitwise varied with the context, not the rows alone (24, 12, 24, 8, 24, 16, 3, 8 rows after 16, 48, 64, 100,
# 128, 200, 300, 500 cached tokens), and padding every call to one row count does not either: the same row at another
# position of a 16-row call moved its logits by up to 20 with it on, 5e-3 off (experiments/openvino_same_model/README).
# Off costs speed: a one-row forward 27 -> 39 ms, L(64) 97 -> 142 ms. So it is a format of its own, w4a8_g<group>:
# the int4_g<group> IR compiled with it on, in OpenVINO's groups of DYNAMIC_GROUP (what its GenAI engine runs); its
# plain decoding is this backend's fastest, but a row's logits there depend on the other rows of the call, so a tree
# verify on it is no lossless match for its plain decoding, as the lossless column of a run shows.
PROPERTIES = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
DYNAMIC_GROUP = 32
# w4a8r_g<group>: the same int4 IR and dynamic quantisation, run so that a row's logits are the same whatever else its
# call holds, so a tree verify on it is its own plain decoding. Two things moved a row before, both measured on
# SmolLM2 (experiments/openvino_row_invariant/README.md): the CPU plugin quantises a one-row call by another kernel
# than a call of several rows (1.29 logits apart; rows of 2 to 16-row calls agree bitwise), and the float32 sums of
# attention run in another order when an ancestor's key is a new row of the call than when it is cached (~1e-6, which
# a rounding to int8 of the next projection's input turns into up to 1.1 logits: 5 of 6 SSSD answers changed). So
# every call runs at least ROW_INVARIANT_MIN_ROWS rows, and the export traces recent_attention, whose key layout
# depends on the query row's position alone. The cost: a plain step of 23.8 against w4a8's 17.7 ms there.
ROW_INVARIANT_MIN_ROWS = 2
ROW_INVARIANT_FORMAT = "w4a8r_g<group>"
# the formats that are OpenVINO's own (its dynamic quantisation of activations), each compiling the int4 IR
OWN_FORMATS = ("w4a8", "w4a8r")
ROW_INVARIANT_ATTENTION = "specbench_recent_v1"
# recent_attention's window: a row at position P reads the keys below b(P) = floor((P - RECENT_DEPTH) / RECENT_STRIDE)
# * RECENT_STRIDE from the cache as it lies and those from b(P) to P gathered in a block of RECENT_WINDOW slots; a call
# may hold rows at most RECENT_DEPTH positions past its cache (a longer chain runs in pieces; a prefill, in one call of
# the split-attention IR: with_openvino says why)
RECENT_STRIDE, RECENT_DEPTH = 8, 16
RECENT_WINDOW = RECENT_STRIDE + RECENT_DEPTH
RECENT_INPUTS = ("recent_cache_slot", "recent_new_row", "recent_is_new", "recent_mask")
# the cache goes in padded with masked-out keys to a multiple of this many tokens: OpenVINO's CPU plugin prepares every
# node again for an input shape it has not just run, 5-9 ms of a 27 ms one-row SmolLM2 call at a new context length
# against the same length again, where a context padded to 256 with its last keys masked ran as fast as the same
# length (the raw int4_g64 IR on a 2-core Cascade Lake); a masked key adds an exact zero to the softmax
BUCKET = 32
# batch-1 calls of at most STATIC_ROWS[-1] rows against at most STATIC_CONTEXTS[-1] cached tokens run a model compiled
# for their shape padded up to these (masked rows and keys): a dynamic-shape call of this CPU plugin spends ~8 ms of a
# 28 ms one-row SmolLM2 call outside its kernels, shape by shape, where a static one spends 3 (int4_g64 on a 2-core
# Cascade Lake: one row 28.4 -> 21.0 ms, 16 rows 54.7 -> 44.8). Each shape costs ~3 s to compile (under 1 s from the
# compile cache) and ~200 MB of memory, so a few: rows for plain decoding, a chain or a small tree, a 16-node tree;
# other calls (prefill, larger trees and contexts, batches) take the dynamic model. Compiled in this order while they
# fit in STATIC_MEMORY of the memory available at the build (a compile's resident cost, measured on the first: ~260
# MiB for SmolLM2 int4_g64, ~1.2 GiB for its float32 weights, which the plugin copies into every compiled model)
STATIC_ROWS = (1, 16, 4, 8)
STATIC_CONTEXTS = (256, 512)
STATIC_MEMORY = 0.25
log = logging.getLogger(__name__)


def unsupported(dtype: torch.dtype, device: torch.device, weights: str = "fp") -> str | None:
    """None when OpenVINO can run this execution here, else why not (one line)."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError:
        return f"OpenVINO is not installed ({INSTALL})"
    if device.type != "cpu":
        return "the openvino backend runs on the CPU"
    if dtype != torch.float32:
        return "the openvino backend runs float32 activations (eval.dtype=float32)"
    if weights == "w8a8":
        return ("the openvino backend compresses weights only (fp, int8, int4_g<group>) or with OpenVINO's own "
                "activation quantisation (w4a8_g<group>), not w8a8")
    return None


def check_run(dtype: str, weights: str, config=None, batch_size: int = 1) -> None:
    """model.backend=openvino's settings, before any model loads: installed, float32 (or auto) activations, weights
    NNCF compresses, an int4 group dividing the model's widths when its config is known, batch 1 for w4a8r."""
    reason = unsupported(torch.float32, torch.device("cpu"), weights) or group_problem(config, weights)
    if reason:
        raise SpecbenchError(f"model.backend=openvino with model.weights={weights}: {reason}")
    if dtype not in ("float32", "auto"):
        raise SpecbenchError(f"model.backend=openvino with eval.dtype={dtype}: the openvino backend runs float32 "
                             f"activations; set eval.dtype=float32")
    if weights.partition("_g")[0] == "w4a8r" and batch_size != 1:
        raise SpecbenchError(f"model.weights={weights} with eval.batch_size={batch_size}: the row-invariant route "
                             f"decodes one prompt at a time; set eval.batch_size=1 (or model.weights=int4)")


def group_problem(config, weights: str) -> str | None:
    """Why NNCF cannot compress this model's linears to `weights` (int4_g<group>: the group must divide every
    linear's input width), None when it can or the config is unknown."""
    if config is None or weights.partition("_g")[0] not in ("int4", *OWN_FORMATS):
        return None
    group = int(weights.rpartition("_g")[2])
    widths = linear_input_widths(config)
    if any(n % group for n in widths):
        return f"the group must divide every linear's input width ({', '.join(map(str, widths))})"
    return None


def ir_folder(loaded: LoadedModel, kind: str, layout: str = "") -> Path:
    """Where an IR of `loaded`'s float weights is cached: keyed by the model's source and config, two of its weights
    (a draft artifact or a changed checkpoint moves them), the OpenVINO and transformers versions and the graph's
    `layout` (what the export traces)."""
    import openvino as ov
    import transformers

    params = list(loaded.model.parameters())
    first, last = (p.detach().float().sum().item() for p in (params[0], params[-1]))
    identity = f"{loaded.source}:{loaded.model.config.to_json_string()}:{first}:{last}"
    versions = f"{ov.__version__}:{transformers.__version__}" + (f":{layout}" if layout else "")
    key = hashlib.sha1(f"{identity}:{versions}".encode()).hexdigest()[:10]
    return cache_dir("openvino") / f"{loaded.name}-{key}-{kind}"


def compressed(ir, weights: str):
    """`ir` with its weights compressed by NNCF: int8 symmetric per output channel, int4_g<group> asymmetric in groups
    (NNCF keeps the embedding and the head in int8 for int4, its default); fp, fp32 and fp16 leave it as it is."""
    if weights in ("fp", "fp32", "fp16"):
        return ir
    import nncf

    # its bitwidth table (a log line) and its progress bar (rich, on stdout) say nothing about the user's run
    nncf.set_log_level(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        if weights == "int8":
            return nncf.compress_weights(ir, mode=nncf.CompressWeightsMode.INT8_SYM)
        return nncf.compress_weights(ir, mode=nncf.CompressWeightsMode.INT4_ASYM,
                                     group_size=int(weights[len("int4_g"):]), ratio=1.0)


def flat_cache(config, past) -> DynamicCache:
    """A DynamicCache holding `past` (key, value per layer, flat), its layers filled directly: DynamicCache.update
    would concatenate onto an empty 1-D tensor, which the OpenVINO frontend cannot give a rank."""
    cache = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        layer.lazy_initialization(past[2 * i], past[2 * i + 1])
        layer.keys, layer.values = past[2 * i], past[2 * i + 1]
    return cache


class _Traced(nn.Module):
    """The forward the IR holds (module docstring): embeddings, mask, positions and the cache in; logits, hidden
    states and the new rows' keys and values out. The cache goes in as one tensor (every layer's keys and values
    stacked: 2 x layers, batch, heads, tokens, head dim) and the hidden states and new rows come out stacked the same
    way: OpenVINO pays per input and output of a dynamic shape on every call (60 cache inputs and 91 outputs took 10 ms
    of a 39 ms SmolLM2 step beyond its kernels). The model runs with ATTENTION (split_attention): its own cache holds
    only the new rows, and the cached ones reach the attention as `cached_kv` (recent_attention's window inputs as
    `recent`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds, attention_mask, position_ids, past, *recent):
        layers = past.unbind(0)
        cache = flat_cache(self.model.config, [t[:, :, :0] for t in layers])
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, output_hidden_states=True, cached_kv=layers,
                         recent=recent)
        new = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return out.logits, torch.stack(out.hidden_states), torch.stack(new)


def split_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cached_kv=(), **_):
    """Attention over the cached keys and the new rows as two blocks, for the exported graph: query (batch, heads, n,
    dim), key and value the new rows only (batch, kv heads, n, dim), `cached_kv` every layer's cached keys and values,
    `attention_mask` the 4D boolean mask over cached + new keys. transformers' SDPA sees the cache concatenated with the
    new rows, which OpenVINO's CPU plugin copies whole on every call (its Concat runs the reference kernel), and its
    grouped-query form goes in as a 5D SDPA the plugin takes apart into a Transpose of the whole cache and two MatMuls:
    in a one-row w4a8_g64 SmolLM2 call on a 2-core Cascade Lake those three grew from 2.8 to 10.1 ms between 128 and
    512 cached tokens, of 13.3 and 23.4 ms (per-op profile). Here each key/value head's queries are one matrix against
    the cache as it lies, the new rows a second small block: nothing is copied and no head is repeated."""
    cached_k, cached_v = cached_kv[2 * module.layer_idx], cached_kv[2 * module.layer_idx + 1]
    batch, heads, n, dim = query.shape
    scaling = dim ** -0.5 if scaling is None else scaling  # SDPA's default, as transformers' sdpa_attention_forward
    kv_heads, groups, past = key.shape[1], heads // key.shape[1], cached_k.shape[2]
    q = query.reshape(batch, kv_heads, groups * n, dim)  # query head h reads key head h // groups, as repeat_kv
    scores = torch.cat([q @ cached_k.transpose(-1, -2), q @ key.transpose(-1, -2)], -1) * scaling
    mask = attention_mask.to(torch.bool).repeat(1, 1, groups, 1)  # row g * n + i is row i's mask
    probs = torch.where(mask, scores, torch.finfo(scores.dtype).min).softmax(-1)
    out = probs[..., :past] @ cached_v + probs[..., past:] @ value
    return out.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None


def recent_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cached_kv=(), recent=(),
                     **_):
    """Attention whose sums run in an order fixed by the query row's position (w4a8r, ROW_INVARIANT_MIN_ROWS): a row at
    position P reads the cached keys below b(P) where they lie (`attention_mask`, batch 1, 1, n, cached slots: the
    host masks the slots from b(P) on) and the keys from b(P) to P in a block of its own, slot P' - b(P) holding
    position P' whether that key is cached or a new row of the call (`recent`: per row and slot, the cache slot, the
    new row, which of the two, and whether it is seen). Plain decoding and a tree verify thus add the same numbers in
    the same places for the same row. query (batch, heads, n, dim), key and value the new rows only."""
    cached_k, cached_v = cached_kv[2 * module.layer_idx], cached_kv[2 * module.layer_idx + 1]
    slot, row, is_new, seen = recent
    batch, heads, n, dim = query.shape
    scaling = dim ** -0.5 if scaling is None else scaling
    kv_heads, width, window = key.shape[1], cached_k.shape[2], slot.shape[1]
    groups = heads // kv_heads

    def block(cached, new):  # (batch, kv heads, n, window, dim): each row's recent keys or values
        from_cache = torch.index_select(cached, 2, slot.reshape(-1)).reshape(batch, kv_heads, n, window, dim)
        from_new = torch.index_select(new, 2, row.reshape(-1)).reshape(batch, kv_heads, n, window, dim)
        return torch.where(is_new[None, None, :, :, None], from_new, from_cache)

    recent_k, recent_v = block(cached_k, key), block(cached_v, value)
    q = query.reshape(batch, kv_heads, groups * n, dim)  # query head h reads key head h // groups, as repeat_kv
    cached_scores = (q @ cached_k.transpose(-1, -2)).reshape(batch, kv_heads, groups, n, width)
    per_row = query.reshape(batch, kv_heads, groups, n, dim).transpose(2, 3)  # (batch, kv heads, n, groups, dim)
    recent_scores = (per_row @ recent_k.transpose(-1, -2)).transpose(2, 3)
    scores = torch.cat([cached_scores, recent_scores], -1) * scaling
    mask = torch.cat([attention_mask.to(torch.bool)[:, :, None].expand(batch, kv_heads, groups, n, width),
                      seen[None, None, None].expand(batch, kv_heads, groups, n, window)], -1)
    probs = torch.where(mask, scores, torch.finfo(scores.dtype).min).softmax(-1)
    out = probs[..., :width].reshape(batch, kv_heads, groups * n, width) @ cached_v
    out = out + (probs[..., width:].transpose(2, 3) @ recent_v).transpose(2, 3).reshape(batch, kv_heads, groups * n, dim)
    return out.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None


def _export(model: nn.Module, weights: str, folder: Path, layout: str = ATTENTION) -> None:
    import openvino as ov

    config = model.config
    kv_heads, layers, width = config.num_key_value_heads, config.num_hidden_layers, head_dim(config)
    n, past = 3, 2
    row_invariant = layout == ROW_INVARIANT_ATTENTION
    mask = torch.ones(n, past + (0 if row_invariant else n), dtype=torch.bool).tril(past)[None, None]
    example = (torch.zeros(1, n, config.hidden_size), mask, torch.arange(past, past + n)[None],
               torch.zeros(2 * layers, 1, kv_heads, past, width))
    if row_invariant:  # the window's inputs: slot, row, which, seen (any values of their types trace the graph)
        index, flags = torch.zeros(n, 4, dtype=torch.long), torch.ones(n, 4, dtype=torch.bool)
        example += (index, index, flags, flags)
    AttentionInterface.register(layout, recent_attention if row_invariant else split_attention)
    AttentionMaskInterface.register(layout, sdpa_mask)  # a 4D mask goes through as given; sdpa's for any other
    attention = model.config._attn_implementation
    model.config._attn_implementation = layout
    try:  # the trace's warnings are about code paths of the model it specialises, nothing a user acts on
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ir = ov.convert_model(_Traced(model), example_input=example)
    except Exception as exc:  # noqa: BLE001  (the frontend raises its own types)
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise SpecbenchError(f"model.backend=openvino cannot export this model: openvino.convert_model failed: "
                             f"{lines[-1][:200] if lines else type(exc).__name__}") from exc
    finally:
        model.config._attn_implementation = attention
    names = ["inputs_embeds", "attention_mask", "position_ids", "past", *(RECENT_INPUTS if row_invariant else ())]
    shapes = [[-1, -1, config.hidden_size], [-1, 1, -1, -1], [-1, -1], [2 * layers, -1, kv_heads, -1, width],
              *([[-1, -1]] * len(RECENT_INPUTS) if row_invariant else [])]
    for port, name, shape in zip(ir.inputs, names, shapes):
        port.get_tensor().set_names({name})
        port.get_node().set_partial_shape(ov.PartialShape(shape))
    ir.validate_nodes_and_infer_types()
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ov.save_model(compressed(ir, weights), tmp / "openvino_model.xml", compress_to_fp16=False)
    try:
        tmp.rename(folder)
    except OSError:  # another process exported it meanwhile: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


class OpenVinoForward(nn.Module):
    """A causal LM's forward as the methods call it (input ids or embeddings, a 4D or 2D mask or none, positions, a
    DynamicCache), run by a compiled OpenVINO IR (module docstring). The embedding stays a PyTorch module, so
    `get_input_embeddings`, `parameters()` and the memory accounting see it."""

    def __init__(self, model: nn.Module, compiled, static: dict | None = None, row_invariant: bool = False,
                 prefill: "OpenVinoForward | None" = None) -> None:
        super().__init__()
        self.row_invariant = row_invariant  # the IR traces recent_attention; every call runs >= 2 rows (w4a8r)
        self.prefill = prefill  # w4a8r: a prompt on an empty cache runs in one call of this (with_openvino says why)
        self.embed = model.get_input_embeddings()
        self.config, self.generation_config = model.config, model.generation_config
        self.request = compiled.create_infer_request()
        self.static = {shape: c.create_infer_request() for shape, c in (static or {}).items()}  # (rows, context)
        self._owners: dict[tuple[int, int], weakref.ref] = {}  # static shape -> the cache whose rows its memory holds
        self.layers = model.config.num_hidden_layers
        self.empty_cache = (2 * self.layers, model.config.num_key_value_heads, 0, head_dim(model.config))
        # a static request's input tensors keep their shape and memory, so their torch views are made once, and its
        # cache input's per-layer views too: making them per call took ~0.6 ms of a 15 ms one-row SmolLM2 step
        self._ports = {shape: tuple(torch.from_numpy(t.data) for t in request.input_tensors)
                       for shape, request in self.static.items()}
        self._layer_ports = {shape: ports[3].unbind(0) for shape, ports in self._ports.items()}
        for ports in self._ports.values():  # masked keys must be finite (0 * nan is nan); later calls leave theirs
            for port in ports:
                port.zero_()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=True, output_hidden_states=False, **_):
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        embeds = embeds.to(torch.float32).detach()
        batch, n = embeds.shape[:2]
        cache = past_key_values if past_key_values is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n)[None].expand(batch, n)
        mask = _mask(attention_mask, batch, n, past)
        if self.row_invariant and (batch != 1 or int(position_ids.max()) - past > RECENT_DEPTH):
            if self.prefill is not None and past == 0 and _causal_chain(mask, position_ids, past):
                return self.prefill(inputs_embeds=embeds, position_ids=position_ids, past_key_values=cache,
                                    output_hidden_states=output_hidden_states)
            return self._in_pieces(embeds, mask, position_ids, cache, output_hidden_states)
        shape = self._static_shape(batch, n, past)
        if shape:
            request, (rows, padded) = self.static[shape], shape
        elif self.row_invariant:  # recent_attention gathers from a cache of at least one slot
            request, rows, padded = self.request, max(n, ROW_INVARIANT_MIN_ROWS), max(-(-past // BUCKET), 1) * BUCKET
        else:
            request, rows, padded = self.request, n, -(-past // BUCKET) * BUCKET
        if rows > n:  # padding rows: zero embeddings, each seeing only itself, outputs dropped
            embeds = torch.cat([embeds, embeds.new_zeros(batch, rows - n, embeds.shape[2])], 1)
            position_ids = torch.cat([position_ids, position_ids[:, -1:].expand(batch, rows - n)], 1)
            mask = torch.cat([torch.cat([mask, mask.new_zeros(batch, 1, n, rows - n)], 3),
                              torch.cat([mask.new_zeros(batch, 1, rows - n, past),
                                         torch.eye(rows, dtype=torch.bool)[n:].expand(batch, 1, rows - n, rows)], 3)],
                             2)
        if self.row_invariant:  # input port -> value
            cached, *window = _window(mask, position_ids, past, padded)
            values = {0: embeds, 1: cached, 2: position_ids, **dict(enumerate(window, start=4))}
        else:
            values = {0: embeds, 1: _padded(mask, past, padded), 2: position_ids}
        layers_kv, kv_heads, _, width = self.empty_cache
        # every input is written straight into the request's own tensors, the cache from its layers in one copy: shared
        # instead (share_inputs=True, or tensors made with shared_memory) the cache's arrays made OpenVINO's CPU
        # plugin corrupt the heap on the call after a tree verify (glibc: corrupted double-linked list), as if it
        # wrote past them
        if shape:
            ports, layer_ports = self._ports[shape], self._layer_ports[shape]
            self._own(shape, cache)
        else:
            ports = {port: _input(request, port, tuple(value.shape)) for port, value in values.items()}
            ports[3] = _input(request, 3, (layers_kv, batch, kv_heads, padded, width))
            layer_ports = ports[3].unbind(0)
            ports[3][:, :, :, past:].zero_()  # masked out, but finite: a masked key's weight is 0, and 0 * nan is nan
        if past:
            for t, port in zip((t for layer in cache.layers for t in (layer.keys, layer.values)), layer_ports):
                if not _views(t, port):  # a layer already in this request's memory is not copied again
                    port[:, :, :past] = t
        for port, value in values.items():
            ports[port].copy_(value)
        request.infer()
        logits, hidden, new = (torch.from_numpy(request.get_output_tensor(i).data) for i in range(3))
        if shape and past and past + n <= padded:
            # the new rows go into the request's own cache tensor behind the cached ones and every layer becomes a
            # view of it, so the next call of this shape copies nothing in and DynamicCache.update concatenates
            # nothing (4 of a 24 ms one-row SmolLM2 step at context 250); crop and commit_path work on views as on
            # any tensor, and _own detaches a cache's views before another cache writes this memory
            ports[3][:, :, :, past:past + n] = new[:, :, :, :n]
            views = ports[3].narrow(3, 0, past + n).unbind(0)
            for layer, keys, values in zip(cache.layers, views[0::2], views[1::2]):
                layer.keys, layer.values = keys, values
        else:
            for layer in range(self.layers):  # copies: the request's output buffers are reused by the next call
                cache.update(new[2 * layer, :, :, :n].clone(), new[2 * layer + 1, :, :, :n].clone(), layer)
        # one copy of every layer's rows, then views: the request's output buffers are reused by the next call
        hidden = hidden[:, :, :n].clone().unbind(0) if output_hidden_states else None
        return CausalLMOutputWithPast(logits=logits[:, :n].clone(), past_key_values=cache, hidden_states=hidden)

    def _in_pieces(self, embeds, mask, position_ids, cache: DynamicCache, output_hidden_states: bool):
        """A row-invariant call too deep for recent_attention's window (a long chain after the prompt) as consecutive
        pieces of RECENT_DEPTH rows, each seeing the pieces before it as cached; only a causal chain of batch 1 can be
        cut so."""
        batch, n = embeds.shape[:2]
        past = cache.get_seq_length()
        if not _causal_chain(mask, position_ids, past):
            raise SpecbenchError(f"model.weights={ROW_INVARIANT_FORMAT}: a call of batch {batch} with rows up to "
                                 f"{int(position_ids.max()) - past} positions past its cache cannot run row-invariant; "
                                 f"it runs batch 1 with trees at most {RECENT_DEPTH} deep (a longer causal chain is "
                                 f"run in pieces)")
        outs = [self.forward(inputs_embeds=embeds[:, i:i + RECENT_DEPTH], past_key_values=cache,
                             output_hidden_states=output_hidden_states) for i in range(0, n, RECENT_DEPTH)]
        hidden = tuple(torch.cat(layer, 1) for layer in zip(*(o.hidden_states for o in outs))) \
            if output_hidden_states else None
        return CausalLMOutputWithPast(logits=torch.cat([o.logits for o in outs], 1), past_key_values=cache,
                                      hidden_states=hidden)

    def _own(self, shape: tuple[int, int], cache: DynamicCache) -> None:
        """`cache` is about to write the static request `shape`'s cache memory: another cache whose layers are views of
        it (a generation before, still referenced) gets copies of them first, so it never sees this cache's rows."""
        owner = self._owners.get(shape)
        other = owner() if owner is not None else None
        if other is not None and other is not cache:
            for layer, port in zip(other.layers, self._layer_ports[shape][0::2]):
                if getattr(layer, "keys", None) is not None and _views(layer.keys, port):
                    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        self._owners[shape] = weakref.ref(cache)

    def _static_shape(self, batch: int, n: int, past: int) -> tuple[int, int] | None:
        """The (rows, context) a compiled static model serves this call at (the smallest that holds it), or None."""
        if batch != 1:
            return None
        fits = [shape for shape in self.static if n <= shape[0] and past <= shape[1]]
        return min(fits) if fits else None


def _causal_chain(mask: torch.Tensor, position_ids: torch.Tensor, past: int) -> bool:
    """Whether a call is one sequence's next rows in order, each seeing the cache and the rows before it (a prefill,
    a chain), which can be cut into consecutive pieces or run by any causal forward."""
    batch, _, n, _ = mask.shape
    return (batch == 1 and torch.equal(position_ids, torch.arange(past, past + n)[None])
            and torch.equal(mask, _mask(None, 1, n, past)))


def _window(mask: torch.Tensor, position_ids: torch.Tensor, past: int, padded: int) -> tuple[torch.Tensor, ...]:
    """recent_attention's inputs for a batch-1 call: the mask over the cache slots below each row's b(P), and per row
    and window slot (position b(P) + slot) the cache slot, the new row, whether the key is a new row's and whether the
    row sees it. `mask` is (1, 1, rows, past + rows), keys cached at slot = position (a committed cache)."""
    seen, positions = mask[0, 0], position_ids[0]
    rows = seen.shape[0]
    start = (positions - RECENT_DEPTH).clamp(min=0) // RECENT_STRIDE * RECENT_STRIDE
    cached = torch.zeros(rows, padded, dtype=torch.bool)
    cached[:, :past] = seen[:, :past] & (torch.arange(past) < start[:, None])
    window = start[:, None] + torch.arange(RECENT_WINDOW)
    is_new = window >= past
    match = seen[:, None, past:] & (positions[None, None] == window[..., None])  # row, slot, new row
    slot = torch.where(is_new, 0, window)
    seen_cached = seen[:, :past].gather(1, slot.clamp(max=past - 1)) if past else torch.zeros_like(is_new)
    return (cached[None, None], slot, match.to(torch.uint8).argmax(-1), is_new,
            torch.where(is_new, match.any(-1), seen_cached))


def _views(t: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether `t` is a leading slice of `base`'s memory: the same first element and strides."""
    return t.data_ptr() == base.data_ptr() and t.stride() == base.stride()


def _input(request, port: int, shape: tuple[int, ...]) -> torch.Tensor:
    """`request`'s own input tensor at `port`, shaped `shape`, as a torch view of its memory."""
    tensor = request.get_input_tensor(port)
    if tuple(tensor.shape) != shape:
        tensor.shape = shape
    return torch.from_numpy(tensor.data)


class OpenVinoLinear(nn.Module):
    """An nn.Linear run by OpenVINO with NNCF's int8 weights (symmetric per output channel), float32 activations: a
    drafter's vocabulary projection, which it computes at every tree level and eager PyTorch reads as the whole float32
    matrix each time (SmolLM2's tied head, 576 x 49152, on a 2-core Cascade Lake: 5.7 ms for one row and 5.9 for three
    eagerly, 1.7 and 2.0 here). For drafting only: the target's verify decides every token, so a draft head in int8
    leaves a run lossless. `weight` stays the float one, which callers read for its shape and dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        import openvino as ov

        self.weight, self.in_features, self.out_features = linear.weight, linear.in_features, linear.out_features
        source = linear if linear.weight.dtype == torch.float32 else copy.deepcopy(linear).float()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ir = ov.convert_model(source, example_input=torch.zeros(2, self.in_features))
        ir.inputs[0].get_node().set_partial_shape(ov.PartialShape([-1, self.in_features]))
        ir.validate_nodes_and_infer_types()
        self.request = _compiled(compressed(ir, "int8")).create_infer_request()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.detach().reshape(-1, self.in_features).to(torch.float32).contiguous()
        self.request.infer([flat.numpy()])
        out = torch.from_numpy(self.request.get_output_tensor(0).data).clone()  # the request reuses its buffer
        return out.reshape(*x.shape[:-1], self.out_features)


def _compiled(model, properties: dict = PROPERTIES):
    """`model` (an ov.Model or an IR's path) compiled for this CPU with PyTorch's thread count and `properties`, its
    blob cached under the specbench cache."""
    import openvino as ov

    core = ov.Core()
    core.set_property({"CACHE_DIR": str(cache_dir("openvino") / "compiled")})
    return core.compile_model(model, "CPU", properties | {"INFERENCE_NUM_THREADS": torch.get_num_threads()})


def _padded(mask: torch.Tensor, past: int, padded: int) -> torch.Tensor:
    """`mask` (batch, 1, n, past + n) with padded - past masked-out keys between the cached ones and the new rows,
    the columns of the cache `forward` gives the IR, padded to a multiple of BUCKET."""
    if padded == past:
        return mask
    batch, _, n, _ = mask.shape
    out = torch.zeros(batch, 1, n, padded + n, dtype=torch.bool)
    out[..., :past] = mask[..., :past]
    out[..., padded:] = mask[..., past:]
    return out


def _mask(mask: torch.Tensor | None, batch: int, n: int, past: int) -> torch.Tensor:
    """The 4D boolean mask the IR takes: a 4D mask as given, else causal over the new rows, with a 2D padding mask
    (batch, past + n) applied to the keys when given."""
    if mask is not None and mask.dim() == 4:
        return mask.to(torch.bool)
    causal = torch.ones(n, past + n, dtype=torch.bool).tril(past)[None, None].expand(batch, 1, n, past + n)
    return causal if mask is None else causal & mask.to(torch.bool)[:, None, None, :]


def with_openvino(target: LoadedModel, weights: str) -> LoadedModel:
    """`target`'s float weights exported (once per machine) to an OpenVINO IR in `weights`, compiled for this CPU
    with PyTorch's thread count and float32 inference."""
    reason = unsupported(torch.float32, next(target.model.parameters()).device, weights)
    if reason:
        raise SpecbenchError(f"model.backend=openvino cannot run here: {reason}")
    problem = group_problem(target.model.config, weights)
    if problem:
        raise SpecbenchError(f"model.backend=openvino cannot compress {target.name} to {weights}: {problem}")
    if target.weights != "fp" or target.backend != "eager":
        raise SpecbenchError(f"model.backend=openvino compresses the float weights itself; it was given a target with "
                             f"weights {target.weights} on backend {target.backend}: give it the eager float model "
                             f"(Execution('openvino', 'float32', '{weights}').apply does)")
    fp32 = with_dtype(target, "float32")
    head, _, group = weights.partition("_g")
    # w4a8 and w4a8r compile the int4 IR (w4a8r's traces recent_attention) with activations quantised on the fly
    stored = f"int4_g{group}" if head in OWN_FORMATS else weights
    row_invariant = head == "w4a8r"
    properties = PROPERTIES | ({"DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNAMIC_GROUP} if stored != weights else {})
    xml = _ir(fp32, stored, ROW_INVARIANT_ATTENTION if row_invariant else ATTENTION)
    rows = tuple(max(r, ROW_INVARIANT_MIN_ROWS) for r in STATIC_ROWS) if row_invariant else STATIC_ROWS
    # A prompt on an empty cache is the same call in a method's run as in its plain decoding, so its rows need not be
    # computed as any other call's: a w4a8r prefill runs in one call of the int4 IR with split_attention (w4a8's, the
    # dynamic-shape model) instead of pieces of RECENT_DEPTH rows, and the steps after it read the keys and values it
    # cached, as plain decoding's do (SmolLM2 on a 2-core Cascade Lake: a 109-token prompt 138 against 238 ms, 60
    # tokens 74 against 133; the pieces were a fifth of a 128-token SSSD answer's wall time on ShareGPT). The cost:
    # that IR compiled beside the row-invariant one (~3 s, ~260 MiB), and exported once if w4a8 has not run here.
    prefill = (OpenVinoForward(fp32.model, _compiled(_ir(fp32, stored, ATTENTION), properties)) if row_invariant
               else None)
    forward = OpenVinoForward(fp32.model, _compiled(xml, properties), _static(xml, properties, rows), row_invariant,
                              prefill)
    return dataclasses.replace(target, model=forward, backend="openvino", weights=weights)


def _ir(fp32: LoadedModel, stored: str, layout: str) -> str:
    """The IR of `fp32`'s forward in weights `stored` tracing attention `layout`, exported on first use."""
    folder = ir_folder(fp32, f"forward-{stored}", layout)
    if not (folder / "openvino_model.xml").exists():
        print(f"notice: exporting {fp32.name} to an OpenVINO IR ({stored}, {layout}) once, into {folder}")
        _export(fp32.model, stored, folder, layout)
    return str(folder / "openvino_model.xml")


def _static(xml: str, properties: dict, static_rows: tuple[int, ...] = STATIC_ROWS) -> dict:
    """(rows, context) -> the IR compiled for that static shape, in STATIC_CONTEXTS x `static_rows` order while the
    next one's resident cost (the largest seen so far) fits in what STATIC_MEMORY of the available memory leaves."""
    budget, compiled, cost = STATIC_MEMORY * (_available_bytes() or math.inf), {}, 0
    start, resident = time.perf_counter(), _resident_bytes()
    for shape in ((rows, context) for context in STATIC_CONTEXTS for rows in static_rows):
        if cost > budget:
            break
        before = _resident_bytes()
        compiled[shape] = _compiled(_reshaped(xml, *shape), properties)
        grown = _resident_bytes() - before
        budget, cost = budget - grown, max(cost, grown)
    log.info("openvino: %d of %d static shapes (rows, cached tokens) compiled in %.1f s, %d MiB resident: %s; other "
             "calls run the dynamic-shape model", len(compiled), len(static_rows) * len(STATIC_CONTEXTS),
             time.perf_counter() - start, (_resident_bytes() - resident) // 2**20, sorted(compiled))
    return compiled


def _available_bytes() -> int | None:
    """Memory the OS can give without swapping (Linux's MemAvailable; else free pages), None where unknown. Read by
    hand, as _resident_bytes is: psutil does both, but it is no dependency of this project (installed here only
    through another package's requirements)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def _resident_bytes() -> int:
    """The process's resident memory now (Linux's /proc/self/statm), else its peak (getrusage: kilobytes on Linux,
    bytes on macOS), which a compile moves only when it grows past it."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _reshaped(xml: str, rows: int, context: int):
    """The IR at `xml` with every input of a static shape: batch 1, `rows` new rows, `context` cached tokens."""
    import openvino as ov

    model = ov.Core().read_model(xml)
    past, hidden = (model.input(name).get_partial_shape() for name in ("past", "inputs_embeds"))
    row_invariant = any(RECENT_INPUTS[0] in port.get_names() for port in model.inputs)
    shapes = {"inputs_embeds": [1, rows, hidden[2].get_length()],
              "attention_mask": [1, 1, rows, context + (0 if row_invariant else rows)], "position_ids": [1, rows],
              "past": [past[0].get_length(), 1, past[2].get_length(), context, past[4].get_length()]}
    model.reshape(shapes | ({name: [rows, RECENT_WINDOW] for name in RECENT_INPUTS} if row_invariant else {}))
    return model
