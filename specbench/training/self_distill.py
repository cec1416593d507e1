"""Self-distillation data (Medusa §2.3.2): the target itself writes the assistant responses to ShareGPT prompts.

Drafters then learn the target's own continuations, which are exactly what greedy verification accepts. Generation is
the slow part, so finished responses are appended to a JSONL cache as they come (each with its conversation's index)
and an interrupted run generates the ones missing. Batches group prompts of similar length (sorted within windows of
WINDOW batches), which halves the padding a prefill computes. The same forwards that choose the tokens also yield the target's hidden states at every position:
the layers a drafter head trains on are appended to a FeatureStore beside the cache (before the response's own line,
so a crash leaves extra rows that the next run trims, never a response without its features). Under DDP one process
writes the cache (the DataModule's prepare_data) and every rank reads it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.training.features import FeatureStore, feature_rows
from specbench.training.sharegpt import Example, prompt_ids

WINDOW = 8  # batches whose prompts are sorted by length together


def cache_file(cache_dir: Path, model_name: str, **params) -> Path:
    # turns=first is left out of the key: caches written before turns existed keep their names
    params = {k: v for k, v in params.items() if (k, v) != ("turns", "first")}
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache_dir) / f"selfdistill-{model_name}-{key}.jsonl"


def feature_dir(cache: Path) -> Path:
    """Where the features of a response cache's sequences live."""
    return cache.with_suffix(".features")


def read_cache(path: Path) -> list[dict]:
    """The cache's records in file order (the feature store's order); a line cut by a crash mid-write is dropped
    from the file."""
    if not path.exists():
        return []
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    return [json.loads(line) for line in text.splitlines()]


@torch.inference_mode()
def generate_responses(target, conversations: list[list[dict]], path: Path, max_prompt_tokens: int = 128,
                       max_new_tokens: int = 128, batch_size: int = 16, layers: tuple[int, ...] = (),
                       answerer=None) -> None:
    """Greedy responses of target (a LoadedModel) to each conversation's first user turn, appended to path, with
    the hidden states `layers` of every fed position appended to the FeatureStore beside it. `answerer` (an
    engine's BatchAnswerer: `answer(prompts) -> responses`) answers a window of prompts at once in place of the
    eager loop; it yields no hidden states, so it answers for a datastore, not for a drafter's features."""
    if answerer is not None and layers:
        raise SpecbenchError("an engine's answers carry no hidden states: features for a drafter come from the "
                             "eager loop (no answerer)")
    path.parent.mkdir(parents=True, exist_ok=True)
    done = read_cache(path)
    tok, model = target.tokenizer, target.model
    cfg = model.config
    store = FeatureStore(feature_dir(path), cfg.hidden_size, cfg.num_hidden_layers,
                         [len(r["prompt"]) + len(r["response"]) for r in done])
    store.trim()
    # one file per state: -1 and num_layers name the same one, which a 2-layer model's fused EAGLE features both ask for
    layers = tuple(sorted({store.index(layer) for layer in layers}))
    if layers:  # layers first asked for now: computed for the responses already cached
        store.fill(model, [r["prompt"] + r["response"] for r in done], layers)
    have = {r["index"] for r in done}
    todo = [i for i in range(len(conversations)) if i not in have]
    if not todo:
        return
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    bar = tqdm(total=len(conversations), initial=len(conversations) - len(todo), desc="self-distillation",
               unit="response", dynamic_ncols=True)
    with path.open("a") as fh:
        for window in range(0, len(todo), batch_size * WINDOW):
            prompts = {i: prompt_ids(tok, conversations[i], max_prompt_tokens)
                       for i in todo[window: window + batch_size * WINDOW]}
            order = sorted(prompts, key=lambda i: (len(prompts[i]), i))
            # an engine schedules a window's prompts itself, keeping batch_size sequences busy as answers end
            step = len(order) if answerer is not None else batch_size
            for start in range(0, len(order), step):
                batch = order[start: start + step]
                answers = ((response, {}) for response in answerer.answer([prompts[i] for i in batch])) \
                    if answerer is not None else _greedy(model, [prompts[i] for i in batch], pad,
                                                         set(target.eos_token_ids), max_new_tokens, tuple(layers))
                for i, (response, hidden) in zip(batch, answers):
                    store.extend([len(prompts[i]) + len(response)])
                    if layers:
                        store.append(hidden)
                    fh.write(json.dumps({"index": i, "prompt": prompts[i], "response": response}) + "\n")
                fh.flush()
                bar.update(len(batch))
    bar.close()


def _greedy(model, prompts: list[list[int]], pad: int, eos: set[int], max_new_tokens: int, layers: tuple[int, ...]):
    """Per prompt: (response cut after its first EOS, {layer: (feature_rows, H) hidden states}).

    A hand-written loop rather than model.generate: one forward per token that also returns the selected hidden
    states, where generate hands back every layer's at every step and runs at about half this loop's throughput
    (experiments/eagle)."""
    n, width = len(prompts), max(map(len, prompts))
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    cache, steps, responses = DynamicCache(), [], [[] for _ in prompts]
    alive = torch.ones(n, dtype=torch.bool, device=device)
    want = layers or None
    for step in range(max_new_tokens):
        out = model.model(input_ids=ids, attention_mask=attn, position_ids=positions, past_key_values=cache,
                          output_hidden_states=want)
        if layers:
            steps.append({layer: out.hidden_states[layer] for layer in layers})
        token = model.get_output_embeddings()(out.last_hidden_state[:, -1]).argmax(-1)
        tokens = token.tolist()
        for row in alive.nonzero().flatten().tolist():
            responses[row].append(tokens[row])
        alive &= ~torch.isin(token, torch.tensor(sorted(eos), device=device))
        if not alive.any() or step == max_new_tokens - 1:
            break
        ids = torch.where(alive, token, pad)[:, None]
        attn = torch.cat([attn, alive[:, None].long()], dim=1)
        positions = positions[:, -1:] + 1
    # one concatenation and one copy to the host per layer: slicing each row's steps apart is 10^5-10^6 small ops
    # a batch at the batch sizes a GPU takes
    states = {layer: torch.cat([s[layer] for s in steps], dim=1).cpu() for layer in layers}
    for row, (p, response) in enumerate(zip(prompts, responses)):
        rows = feature_rows(len(p) + len(response))
        yield response, {layer: states[layer][row, width - len(p):][:rows] for layer in layers}


def read_responses(path: Path, count: int) -> list[Example]:
    """The responses to the first `count` conversations as training examples, in conversation order; each example's
    row is its record's place in the cache (and in its feature store)."""
    done = {r["index"]: (row, r) for row, r in enumerate(read_cache(path)) if r["index"] < count}
    if len(done) < count:
        raise SpecbenchError(f"self-distillation cache '{path}' holds {len(done)} of the {count} responses needed: "
                             f"it is written by the DataModule's prepare_data; delete it to regenerate")
    return [Example(r["prompt"] + r["response"], [False] * len(r["prompt"]) + [True] * len(r["response"]), row)
            for row, r in (done[i] for i in range(count))]
