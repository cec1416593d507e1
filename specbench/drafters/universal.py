"""Drafting with a model of another tokenizer (universal assisted decoding, as transformers'
AssistedCandidateGeneratorDifferentTokenizers does it): text is the common language.

Every step the committed target tokens are decoded to text and encoded with the draft's tokenizer; the draft's KV
cache keeps the longest prefix of that encoding it already holds (a tail the new text re-tokenised is fed again), and
the draft proposes a chain of its own tokens greedily. The text they add is encoded with the target's tokenizer right
after the committed tokens, and that chain is what the target verifies. The target checks its own tokens, so the
output is the target's whatever the translation (exact acceptance, and rejection sampling, which treats the chain as
deterministic candidates); a poor translation only costs acceptance. The tokenizer work is timed apart
(`translate_time`, inside the step's draft time).
"""

from __future__ import annotations

from time import perf_counter

import torch
from transformers import DynamicCache

from specbench.models.loading import LoadedModel
from specbench.verification import commit_path

LOOKBEHIND = 8  # tokens of left context decoded with a continuation: a token's text can depend on its neighbours


class TextBridge:
    """Token ids of the target's tokenizer to the draft's and back, through text."""

    def __init__(self, target_tokenizer, draft_tokenizer) -> None:
        self.target, self.draft = target_tokenizer, draft_tokenizer

    def to_draft(self, target_ids: list[int]) -> list[int]:
        """The draft's own encoding of the committed text (special tokens dropped: they have no text)."""
        text = self.target.decode(target_ids, skip_special_tokens=True)
        return self.draft(text, add_special_tokens=True)["input_ids"]

    def continuation(self, draft_ids: list[int], new_ids: list[int]) -> str:
        """The text new_ids add after draft_ids."""
        tail = draft_ids[-LOOKBEHIND:]
        before = self.draft.decode(tail, skip_special_tokens=True)
        after = self.draft.decode(tail + new_ids, skip_special_tokens=True)
        return after[len(before):] if after.startswith(before) else self.draft.decode(new_ids, skip_special_tokens=True)

    def to_target(self, target_ids: list[int], text: str) -> list[int]:
        """Target tokens for text right after target_ids: the last committed tokens' text and text encoded together,
        cut where the committed text ends; when a token would straddle that point, text encoded alone."""
        tail = target_ids[-LOOKBEHIND:]
        before = self.target.decode(tail, skip_special_tokens=True)
        ids = self.target(before + text, add_special_tokens=False)["input_ids"]
        if ids[: len(tail)] == tail:
            return ids[len(tail):]
        for cut in range(len(ids) + 1):
            decoded = self.target.decode(ids[:cut], skip_special_tokens=True)
            if decoded == before:
                return ids[cut:]
            if len(decoded) > len(before):
                break
        return self.target(text, add_special_tokens=False)["input_ids"]


class UniversalDraft:
    """A draft model with its own tokenizer and KV cache, proposing chains of target tokens."""

    def __init__(self, target: LoadedModel, draft: LoadedModel) -> None:
        self.bridge = TextBridge(target.tokenizer, draft.tokenizer)
        self.eos, self.max_context = set(draft.eos_token_ids), draft.max_context
        self.target_vocab = target.model.config.vocab_size  # ids the target can embed (tokenizers may hold more)
        self.reset()

    def reset(self) -> None:
        self.cache, self.fed = DynamicCache(), []  # fed: the draft tokens whose keys and values the cache holds
        self.translate_time = 0.0  # this prompt's tokenizer work, seconds

    @torch.inference_mode()
    def propose(self, model, target_ids: list[int], length: int) -> list[int]:
        """Up to `length` target tokens continuing target_ids (fewer when the draft stops or the text runs out);
        model: the draft's forward (on the run's backend)."""
        start = perf_counter()
        ids = self.bridge.to_draft(target_ids)
        self.translate_time += perf_counter() - start
        if not ids or length < 1 or len(ids) + length >= self.max_context:
            return []
        keep = 0
        while keep < min(len(self.fed), len(ids) - 1) and self.fed[keep] == ids[keep]:
            keep += 1  # the cache's prefix still valid; at least one token is fed for the next distribution
        commit_path(self.cache, keep, [])
        self.fed, feed, new = ids[:keep], ids[keep:], []
        for _ in range(length):
            out = model(input_ids=torch.tensor([feed], device=model.device), past_key_values=self.cache,
                        use_cache=True, logits_to_keep=1)
            self.fed += feed
            token = int(out.logits[0, -1].argmax())
            if token in self.eos:
                break
            new.append(token)
            feed = [token]
        start = perf_counter()
        chain = self.bridge.to_target(target_ids, self.bridge.continuation(ids, new)) if new else []
        self.translate_time += perf_counter() - start
        valid = next((i for i, t in enumerate(chain) if not 0 <= t < self.target_vocab), len(chain))
        return chain[: min(valid, length)]
