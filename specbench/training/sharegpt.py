"""ShareGPT conversations formatted with the target's chat template, for training drafters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Example:
    """One training sequence; loss_mask marks the assistant tokens that supervise the drafter."""

    input_ids: list[int]
    loss_mask: list[bool]
    row: int = -1  # its number in the FeatureStore that holds its hidden states (-1: none)


def _template_len(tokenizer, messages: list[dict], add_generation_prompt: bool) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        return_dict=False)
    return len(ids)


def format_conversation(tokenizer, messages: list[dict], max_length: int) -> Example:
    """The whole conversation through the chat template, truncated to max_length, assistant spans marked."""
    ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))[:max_length]
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _template_len(tokenizer, messages[:i], add_generation_prompt=True)
        if start >= max_length:
            break
        end = min(_template_len(tokenizer, messages[: i + 1], add_generation_prompt=False), len(ids))
        mask[start:end] = [True] * (end - start)
    return Example(ids, mask)


def prompt_ids(tokenizer, messages: list[dict], max_prompt_tokens: int) -> list[int]:
    """The first user turn as a generation prompt (its text cut to fit max_prompt_tokens), for self-distillation."""
    text = messages[0]["content"]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    while len(ids) > max_prompt_tokens and len(text) > 16:
        text = text[: int(len(text) * max_prompt_tokens / len(ids) * 0.9)]
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    return list(ids)
