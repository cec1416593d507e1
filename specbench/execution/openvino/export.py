"""The target's forward exported to an OpenVINO IR, once per machine: traced by `openvino.convert_model` with its
inputs as the verify gives them, weights compressed by NNCF, cached under the specbench cache keyed by the model, the
versions that shape the IR and the attention it traces, and written whole (a temporary folder, renamed)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.execution.openvino.attention import (ATTENTION, PREFILL_ATTENTION, RECENT_INPUTS,
                                                    ROW_INVARIANT_ATTENTION, register)
from specbench.files import check_writable
from specbench.models.loading import LoadedModel, cache_root
from specbench.models.shape import head_dim

# the IR's inputs in order (recent_attention's window inputs follow them in its layout)
INPUTS = ("inputs_embeds", "attention_mask", "position_ids", "past", "logits_rows", "hidden_rows")
# written last into a finished export: each of its files and their sizes, so an export cut short on disk (a full disk,
# a copy interrupted, a file truncated by hand) is found before OpenVINO reads it and fails naming no file
MANIFEST = "specbench_export.json"


def ir_folder(loaded: LoadedModel, kind: str, layout: str = "") -> Path:
    """Where an IR of `loaded`'s float weights is cached: keyed by the model's source and config, two of its weights
    (a draft artifact or a changed checkpoint moves them), the OpenVINO and transformers versions and the graph's
    `layout` (what the export traces)."""
    import openvino as ov
    import transformers

    versions = f"{ov.__version__}:{transformers.__version__}" + (f":{layout}" if layout else "")
    # not cache_dir(): a read-only cache that already holds the IR is read as it is; writing is checked by save_whole
    return cache_root() / "openvino" / f"{loaded.name}-{model_key(loaded, versions)}-{kind}"


def model_key(loaded: LoadedModel, versions: str) -> str:
    """A short key of `loaded`'s float weights as an export reads them (its source and config, two of its weights: a
    draft artifact or a changed checkpoint moves them) and of `versions`, the libraries' versions that shape the
    export."""
    params = list(loaded.model.parameters())
    first, last = (p.detach().float().sum().item() for p in (params[0], params[-1]))
    identity = f"{loaded.source}:{loaded.model.config.to_json_string()}:{first}:{last}"
    return hashlib.sha1(f"{identity}:{versions}".encode()).hexdigest()[:10]


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
    """The forward the IR holds: embeddings, mask, positions, the cache and the rows whose logits and hidden states
    are wanted in; those logits and hidden states and the new rows' keys and values out. The cache goes in as one
    tensor (every layer's keys and values stacked: 2 x layers, batch, heads, tokens, head dim) and the hidden states
    and new rows come out stacked the same way: OpenVINO pays per input and output on every call
    (experiments/openvino_same_model). `logits_rows` and `hidden_rows` (row indices) keep a prefill from projecting
    every prompt row onto the vocabulary and a call whose drafter reads no hidden state from copying them out. The model
    runs with the layout's attention (attention.py): its own cache holds only the new rows, and the cached ones reach
    the attention as `cached_kv` (recent_attention's window inputs as `recent`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds, attention_mask, position_ids, past, logits_rows, hidden_rows, *recent):
        layers = past.unbind(0)
        cache = flat_cache(self.model.config, [t[:, :, :0] for t in layers])
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, output_hidden_states=True, cached_kv=layers,
                         recent=recent, logits_to_keep=logits_rows)
        new = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return out.logits, torch.stack(out.hidden_states).index_select(2, hidden_rows), torch.stack(new)


def exported(fp32: LoadedModel, stored: str, layout: str) -> str:
    """The path of the IR of `fp32`'s forward in weights `stored` tracing attention `layout`, exported on first use
    (and again when the cached one is unusable)."""
    folder = ir_folder(fp32, f"forward-{stored}", layout)
    if not usable(folder):
        print(f"notice: exporting {fp32.name} to an OpenVINO IR ({stored}, {layout}) once, into {folder}")
        export(fp32.model, stored, folder, layout)
    return str(folder / "openvino_model.xml")


def usable(folder: Path, what: str = "OpenVINO export") -> bool:
    """Whether `folder` holds a whole export (every file MANIFEST records, at its size). One that does not is
    removed with a one-line notice naming it as `what`, so the caller exports it again instead of every later run
    failing on it."""
    if not folder.exists():
        return False
    why = None
    try:
        sizes = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        why = "it holds no record of a finished export"
    else:
        wrong = [name for name, size in sizes.items()
                 if not (folder / name).is_file() or (folder / name).stat().st_size != size]
        if wrong:
            why = f"{', '.join(wrong)} missing or of another size than exported"
    if why is None:
        return True
    print(f"notice: the cached {what} {folder} is unusable ({why}); exporting it again")
    broken = folder.with_name(f"{folder.name}.broken{os.getpid()}")
    try:
        folder.rename(broken)
    except OSError as exc:
        raise SpecbenchError(f"the cached {what} {folder} is unusable ({why}) and cannot be removed "
                             f"({exc.strerror or exc}): remove it, or set SPECBENCH_CACHE to a folder you can "
                             f"write") from None
    shutil.rmtree(broken, ignore_errors=True)
    return False


def save_whole(folder: Path, save) -> None:
    """`save(tmp)` into a temporary folder beside `folder`, MANIFEST written last, then renamed to `folder`: a reader
    finds a whole export or none, and an export that fails or is interrupted leaves nothing behind."""
    check_writable(folder.parent, "cache folder",
                   f"set SPECBENCH_CACHE to a folder you can write (it is {cache_root()})")
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save(tmp)
        sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps(sizes, indent=1))
        with contextlib.suppress(OSError):  # another process exported it meanwhile: keep theirs
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def quiet_transformers():
    """transformers' logger held at errors while OpenVINO's frontend traces a model: it reads every attribute, and a
    property such as `loss_function` logs a notice about training settings a user of inference never set. By hand:
    transformers sets its verbosity but offers no context that restores it."""
    from transformers.utils import logging as transformers_logging

    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(level)


@contextlib.contextmanager
def interrupt_after(what: str):
    """Ctrl-C (SIGINT) held while OpenVINO's C++ code runs `what` and raised as KeyboardInterrupt once it returns:
    a KeyboardInterrupt raised inside a Python callback of its frontend terminates the process or comes out as a
    conversion error. A no-op off the main thread, where Python delivers no signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def hold(signum, frame):
        if not received:
            print(f"\ninterrupted: stopping once OpenVINO's {what} returns", file=sys.stderr)
        received.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def export(model: nn.Module, weights: str, folder: Path, layout: str = ATTENTION) -> None:
    """`model`'s forward (_Traced) with attention `layout`, compressed to `weights`, saved into `folder` whole."""
    import openvino as ov

    config = model.config
    kv_heads, layers, width = config.num_key_value_heads, config.num_hidden_layers, head_dim(config)
    row_invariant = layout == ROW_INVARIANT_ATTENTION
    n, past = 3, 0 if layout == PREFILL_ATTENTION else 2  # prefill_attention serves an empty cache only
    mask = torch.ones(n, past + (0 if row_invariant else n), dtype=torch.bool).tril(past)[None, None]
    example = (torch.zeros(1, n, config.hidden_size), mask, torch.arange(past, past + n)[None],
               torch.zeros(2 * layers, 1, kv_heads, past, width), torch.arange(n), torch.arange(n))
    if row_invariant:  # the window's inputs: slot, row, which, seen (any values of their types trace the graph)
        index, flags = torch.zeros(n, 4, dtype=torch.long), torch.ones(n, 4, dtype=torch.bool)
        example += (index, index, flags, flags)
    register(layout)
    attention = model.config._attn_implementation
    model.config._attn_implementation = layout
    try:  # the trace's warnings are about code paths of the model it specialises, nothing a user acts on
        with torch.no_grad(), warnings.catch_warnings(), quiet_transformers(), \
                interrupt_after("conversion of the model"):
            warnings.simplefilter("ignore")
            ir = ov.convert_model(_Traced(model), example_input=example)
    except Exception as exc:  # noqa: BLE001  (the frontend raises its own types)
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise SpecbenchError(f"model.backend=openvino cannot export this model: openvino.convert_model failed: "
                             f"{lines[-1][:200] if lines else type(exc).__name__}") from exc
    finally:
        model.config._attn_implementation = attention
    names = [*INPUTS, *(RECENT_INPUTS if row_invariant else ())]
    shapes = [[-1, -1, config.hidden_size], [-1, 1, -1, -1], [-1, -1], [2 * layers, -1, kv_heads, -1, width], [-1],
              [-1], *([[-1, -1]] * len(RECENT_INPUTS) if row_invariant else [])]
    save_ir(ir, dict(zip(names, shapes)), weights, folder)


def save_ir(ir, inputs: dict[str, list[int]], weights: str, folder: Path) -> None:
    """A traced `ir` with its inputs named and their shapes made dynamic where -1 (`inputs`, in the IR's order),
    compressed to `weights` and saved into `folder` whole."""
    import openvino as ov

    for port, (name, shape) in zip(ir.inputs, inputs.items()):
        port.get_tensor().set_names({name})
        port.get_node().set_partial_shape(ov.PartialShape(shape))
    ir.validate_nodes_and_infer_types()

    def save(tmp: Path) -> None:
        with interrupt_after("compression and saving of the IR"):
            ov.save_model(compressed(ir, weights), tmp / "openvino_model.xml", compress_to_fp16=False)

    save_whole(folder, save)
