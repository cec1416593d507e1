"""A distilled draft written as a GGUF beside its target's, for engines that read GGUF (llama.cpp's draft model).

The draft is the target's first N layers retrained, on the target's embedding and head (models/distilled_draft.py),
so its GGUF is the target's with N blocks: every metadata key copied (tokenizer, chat template, rope) but the block
count, the embedding copied as stored (its quantisation kept), and the draft's own layers and final norm in float32.
Llama's q/k rows are permuted into llama.cpp's rope layout as llama.cpp's own converter does (convert_hf_to_gguf.py,
`LlamaModel.permute`); transformers undoes it when it loads a GGUF, which is how the test checks the file. Written by
hand because llama.cpp's converter is a script in its repository, not a package: gguf-py writes the file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import gguf
import numpy as np

from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel, cache_dir

# transformers' Llama decoder layer -> llama.cpp's tensor names
LAYER_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Each head's rows from transformers' rotate-half order into llama.cpp's interleaved pairs."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def draft_gguf(target_gguf: Path, draft: LoadedModel) -> Path:
    """The GGUF of `draft` (a distilled draft of the model in target_gguf), cached under cache_root()/gguf."""
    config = draft.model.config
    tensors = {name: p.detach().float().cpu().numpy() for name, p in draft.model.model.named_parameters()
               if name.startswith(("layers.", "norm."))}
    digest = hashlib.sha1(str(target_gguf.resolve()).encode())
    for name in sorted(tensors):
        digest.update(tensors[name].tobytes())
    out = cache_dir("gguf") / f"{draft.name}-{digest.hexdigest()[:10]}.gguf"
    if out.exists():
        return out
    reader = gguf.GGUFReader(target_gguf)
    arch = str(reader.fields["general.architecture"].contents())
    if arch != "llama":
        raise SpecbenchError(f"a draft GGUF is written for llama-architecture GGUFs; {target_gguf.name} is '{arch}'")
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        value = config.num_hidden_layers if key == f"{arch}.block_count" else field.contents()
        if key == "general.file_type":
            value = int(gguf.LlamaFileType.GUESSED)  # mixed: the embedding as stored, the layers float32
        writer.add_key_value(key, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") or tensor.name == "output_norm.weight":
            continue  # the draft's own
        floats = tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=None if floats else tensor.tensor_type)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for i in range(config.num_hidden_layers):
        for ours, theirs in LAYER_TENSORS.items():
            weight = tensors[f"layers.{i}.{ours}.weight"]
            if theirs in ("attn_q", "attn_k"):
                weight = rope_permute(weight, heads if theirs == "attn_q" else kv_heads)
            writer.add_tensor(f"blk.{i}.{theirs}.weight", np.ascontiguousarray(weight))
    writer.add_tensor("output_norm.weight", tensors["norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out

