"""Self-distillation data (Medusa §2.3.2): the target itself writes the assistant responses to ShareGPT prompts.

Drafters then learn the target's own continuations, which are exactly what greedy verification accepts. Generation is
the slow part, so finished responses are appended to a JSONL cache as they come and an interrupted run picks up
where it stopped. Under DDP one process writes the cache (the DataModule's prepare_data) and every rank reads it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specbench.errors import SpecbenchError
from specbench.training.sharegpt import Example, prompt_ids


def cache_file(cache_dir: Path, model_name: str, **params) -> Path:
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache_dir) / f"selfdistill-{model_name}-{key}.jsonl"


@torch.inference_mode()
def generate_responses(target, conversations: list[list[dict]], path: Path, max_prompt_tokens: int = 128,
                       max_new_tokens: int = 128, batch_size: int = 16) -> None:
    """Greedy responses of target (a LoadedModel) to each conversation's first user turn, appended to path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = len(path.read_text().splitlines()) if path.exists() else 0
    tok, model = target.tokenizer, target.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    prompts = [prompt_ids(tok, c, max_prompt_tokens) for c in conversations[done:]]
    if not prompts:
        return
    bar = tqdm(total=len(conversations), initial=done, desc="self-distillation", unit="response", dynamic_ncols=True)
    with path.open("a") as fh:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start: start + batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=model.device)
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad, eos_token_id=target.eos_token_ids)
            for p, row in zip(batch, out[:, width:].tolist()):
                fh.write(json.dumps({"prompt": p, "response": _cut_at_eos(row, set(target.eos_token_ids))}) + "\n")
            fh.flush()
            bar.update(len(batch))
    bar.close()


def read_responses(path: Path, count: int) -> list[Example]:
    """The first `count` cached responses as training examples (generate_responses wrote them)."""
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if len(done) < count:
        raise SpecbenchError(f"self-distillation cache '{path}' holds {len(done)} responses, {count} are needed: "
                             f"it is written by the DataModule's prepare_data; delete it to regenerate")
    return [Example(r["prompt"] + r["response"], [False] * len(r["prompt"]) + [True] * len(r["response"]))
            for r in done[:count]]


def _cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens
