"""A tiny random Llama with a byte-level tokenizer, built in-process for tests (no files, no network)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specbench.models.loading import LoadedModel, torch_dtype

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens plus ChatML specials; a real HF tokenizer, so every code path is the production one."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                   pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                max_context: int = 512, vocab_size: int | None = None, tokenizer=None) -> LlamaConfig:
    """The tiny model's config, known before any weight exists (specbench.schema checks settings against it)."""
    tokenizer = tokenizer or byte_tokenizer()
    return LlamaConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=hidden_size,
                       intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                       num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                       max_position_embeddings=max_context, eos_token_id=tokenizer.eos_token_id,
                       bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True)


def tiny_random(name: str = "tiny_random", hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, max_context: int = 512, seed: int = 0, dtype: str = "float32",
                device: str = "cpu", vocab_size: int | None = None, chat_template: bool = True) -> LoadedModel:
    tokenizer = byte_tokenizer()
    config = tiny_config(hidden_size, num_layers, num_heads, num_kv_heads, max_context, vocab_size, tokenizer)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so drafts get accepted sometimes
        model.lm_head.weight.mul_(8.0)
    model = model.to(dtype=torch_dtype(dtype), device=device).eval()
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, source="in-process random init",
                       chat_template=chat_template)
