"""A draft of another tokenizer (universal assisted decoding): lossless by construction, exact translation when the
draft is the target in disguise, the text bridge round-trips, tokenizer time is measured apart, refusals are clear.

The tokenizers are real HF tokenizers over a small ASCII alphabet: the target's one character per token, the
drafts' either the same characters under other ids (the target in disguise: the draft model is the target with its
embedding and LM-head rows permuted the same way) or with merges (another segmentation of the same text)."""

from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specbench.acceptance import ExactAcceptance
from specbench.acceptance.rejection import RejectionSampling
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.universal import TextBridge
from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel
from specbench.sampling import SamplingParams
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy

from . import test_rejection as rej

CHARS = "abcdefghij .,"
MERGES = [("a", "b"), ("c", "d"), ("Ġ", "e"), ("ab", "c"), ("f", "g"), ("Ġe", "f")]
PROMPTS = ["abc de", "j.i,hg fe"]


def byte_char(c: str) -> str:
    return {" ": "Ġ"}.get(c, c)  # byte-level BPE's name for the space; the other characters name themselves


def char_tokenizer(order: list[int] | None = None, merges=()) -> PreTrainedTokenizerFast:
    """Byte-level BPE over CHARS (+ merges), token i of the base list at id order[i]."""
    tokens = [byte_char(c) for c in CHARS] + ["".join(m) for m in merges]
    ids = order or list(range(len(tokens)))
    tok = Tokenizer(models.BPE(vocab={t: ids[i] for i, t in enumerate(tokens)}, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def random_lm(tokenizer, seed: int, name: str) -> LoadedModel:
    """A tiny Llama over the tokenizer's vocabulary, untied and sharp, so its greedy output follows the context."""
    vocab = len(tokenizer)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    torch.nn.init.normal_(model.lm_head.weight, std=3 / 32 ** 0.5)
    return LoadedModel(name=name, model=model.eval(), tokenizer=tokenizer, source="test", chat_template=False)


def disguised(target: LoadedModel, order: list[int]) -> LoadedModel:
    """The target under a tokenizer whose token i has id order[i]: the same model, rows permuted to match."""
    model = copy.deepcopy(target.model)
    perm = torch.tensor(order)
    with torch.no_grad():
        for weight in (model.model.embed_tokens.weight, model.lm_head.weight):
            rows = weight.clone()
            weight[perm] = rows
    return LoadedModel(name="disguised", model=model, tokenizer=char_tokenizer(order), source="test",
                       chat_template=False)


@pytest.fixture(scope="module")
def target():
    return random_lm(char_tokenizer(), seed=0, name="char_target")


def encode(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer(text)["input_ids"]


def decode(loaded, drafter, prompt, n=40, rule=None, sampling=None, seed=0):
    return Decoder(loaded.model, drafter, rule or ExactAcceptance(), sampling or SamplingParams(), n,
                   seed=seed).generate(prompt)


def test_the_target_in_disguise_is_accepted_every_step(target):
    """Its tokens are the target's greedy tokens under other ids: exact translation accepts every draft token."""
    order = torch.randperm(len(CHARS), generator=torch.Generator().manual_seed(3)).tolist()
    drafter = DraftModelDrafter(target, ChainPolicy(budget=5), draft_model=disguised(target, order), translate=True)
    assert drafter.universal is not None
    for text in PROMPTS:
        prompt = encode(target, text)
        want = decode(target, PlainDrafter(), prompt).tokens
        got = decode(target, drafter, prompt)
        assert got.tokens == want
        assert [s.accepted for s in got.steps[:-1]] == [4] * (len(got.steps) - 1)


@pytest.fixture(scope="module")
def merged_draft():
    """A random draft whose tokenizer segments the same text differently (merges) under other ids."""
    order = torch.randperm(len(CHARS) + len(MERGES), generator=torch.Generator().manual_seed(5)).tolist()
    return random_lm(char_tokenizer(order, MERGES), seed=7, name="merged_draft")


@pytest.mark.parametrize("rule", [ExactAcceptance(), RejectionSampling()], ids=["exact", "rejection"])
def test_another_segmentation_stays_lossless(target, merged_draft, rule):
    drafter = DraftModelDrafter(target, ChainPolicy(budget=4), draft_model=merged_draft, translate=True)
    for text in PROMPTS:
        prompt = encode(target, text)
        want = decode(target, PlainDrafter(), prompt, n=48).tokens
        got = decode(target, drafter, prompt, n=48, rule=rule)
        assert got.tokens == want
        assert all(s.tree_size > 1 for s in got.steps[:-1])  # every step verified a translated chain
        assert drafter.translate_time > 0
        assert drafter.translate_time < sum(s.draft_time for s in got.steps)  # tokenizer work inside the draft time


def test_the_draft_cache_holds_its_own_encoding_of_the_committed_text(target, merged_draft):
    drafter = DraftModelDrafter(target, ChainPolicy(budget=4), draft_model=merged_draft, translate=True)
    prompt = encode(target, PROMPTS[1])
    decode(target, drafter, prompt, n=30)
    draft = drafter.universal
    fed = draft.fed
    assert draft.cache.get_seq_length() == len(fed)
    fresh = DynamicCache()
    with torch.no_grad():
        merged_draft.model(input_ids=torch.tensor([fed]), past_key_values=fresh, use_cache=True)
    for ours, ref in zip(draft.cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys, ref.keys, atol=1e-5, rtol=1e-5)


def test_text_bridge_continues_the_committed_text_exactly(target, merged_draft):
    bridge = TextBridge(merged_draft.tokenizer, target.tokenizer)  # target: merges; the draft: characters
    ours = merged_draft.tokenizer
    for committed, text in [("abc de", "fg ab"), ("j.i,", " ef"), ("a", "bcd"), ("", "ab ef")]:
        ids = ours(committed)["input_ids"]
        cont = bridge.to_target(ids, text)
        assert ours.decode(ids + cont) == committed + text
        if committed and committed[-1] == "a" and text[0] == "b":  # "ab" would straddle: the text encoded alone
            assert cont == ours(text)["input_ids"]
    draft_ids = target.tokenizer("hi, ab")["input_ids"]
    assert bridge.continuation(draft_ids, target.tokenizer(" cd")["input_ids"]) == " cd"
    assert bridge.to_draft(ours("abc ef")["input_ids"]) == target.tokenizer("abc ef")["input_ids"]


# samples through the real decode loop with text translation (~20 ms each): fewer than test_rejection.py's 3000, and
# still enough to fail the rule without the residual (test_the_universal_test_fails_without_the_residual)
UNIVERSAL_SAMPLES = 1000


def universal_samples(rule) -> tuple[float, float, int]:
    """(TV, its bound, tokens accepted) of UNIVERSAL_SAMPLES answers drafted by a model of another tokenizer (the
    target's 8 tokens under other ids, with noise), whose chains reach the target only through text."""
    target = rej.lively_tiny(0)
    vocab = target.tokenizer.get_vocab()
    strings = sorted(vocab, key=vocab.get)
    order = [3, 0, 6, 1, 7, 2, 5, 4]
    draft = rej.noisy_copy(target, noise=1.5)
    tok = Tokenizer(models.BPE(vocab={s: (order[i] if i < 8 else i) for i, s in enumerate(strings)}, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    draft.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    with torch.no_grad():
        for weight in (draft.model.model.embed_tokens.weight, draft.model.lm_head.weight):
            weight[torch.tensor(order)] = weight.clone()
    drafter = DraftModelDrafter(target, ChainPolicy(budget=3), draft_model=draft, translate=True)
    samples = torch.empty(UNIVERSAL_SAMPLES, rej.TOKENS, dtype=torch.long)
    accepted = 0
    for i in range(UNIVERSAL_SAMPLES):
        gen = decode(target, drafter, rej.PROMPT, rej.TOKENS, rule, rej.SAMPLING, seed=10**6 + i)
        samples[i] = torch.tensor(gen.tokens)
        accepted += sum(s.accepted for s in gen.steps)
    tv, bound = rej.tv_and_bound(samples, rej.exact_distribution(rej.logits_table(target.model, rej.TOKENS)))
    return tv, bound, accepted


@pytest.mark.slow
def test_rejection_sampling_with_a_draft_of_another_tokenizer_keeps_the_distribution():
    """test_rejection.py's TV test with the real drafter and its text bridge."""
    tv, bound, accepted = universal_samples(RejectionSampling())
    assert tv < bound, f"TV {tv:.4f} exceeds the bound {bound:.4f} for {UNIVERSAL_SAMPLES} samples"
    assert accepted > UNIVERSAL_SAMPLES // 4, "the translated drafts must be accepted sometimes, or the test proves little"


@pytest.mark.slow
def test_the_universal_test_fails_without_the_residual():
    tv, bound, _ = universal_samples(rej.RejectionWithoutResidual())
    assert tv > bound, f"the broken rule passed (TV {tv:.4f} <= bound {bound:.4f}): the test has no power"


def test_another_tokenizer_is_refused_without_translate_or_with_a_tree(target, merged_draft):
    with pytest.raises(SpecbenchError, match="different tokenizer.*method.draft.translate=true"):
        DraftModelDrafter(target, ChainPolicy(budget=4), draft_model=merged_draft)
    with pytest.raises(SpecbenchError, match="another tokenizer.*use tree=chain"):
        DraftModelDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), draft_model=merged_draft,
                          translate=True)


def test_a_same_tokenizer_draft_ignores_translate(target):
    drafter = DraftModelDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), draft_model=target, translate=True)
    assert drafter.universal is None and drafter.translate_time == 0.0
