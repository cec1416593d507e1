"""Batched speculative decoding: one forward verifies b sequences and each sequence stays lossless (fp32 greedy: its
tokens equal Decoder's and plain decoding's; sampling: equal to the b=1 Decoder with the same seed),
whatever the method, with prompts of different lengths and sequences stopping at different steps."""

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.acceptance.rejection import RejectionSampling
from specbench.batching import BatchDecoder, fork_drafter, validate_batch_size
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.drafters.ppd import PPDDrafter, PromptTokens
from specbench.drafters.sssd import SSSDDrafter
from specbench.errors import SpecbenchError
from specbench.models.artifact import save_artifact
from specbench.models.tiny import tiny_random
from specbench.sampling import SamplingParams
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.native import NativePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import commit_batch, commit_path, prefill_batch, verify_batch, verify_tree

from .conftest import random_medusa_artifact

VOCAB, MAX_NEW = 64, 24
ACC = [[0.5, 0.2, 0.1, 0.05], [0.4, 0.2, 0.1, 0.05], [0.3, 0.1, 0.1, 0.05]]


@pytest.fixture(scope="module")
def target():
    """tiny_random with an untied embedding and LM head, so its greedy output depends on the context (the byte
    model's greedy output repeats one token whatever the prompt, which would hide a sequence reading another's)."""
    loaded = tiny_random(vocab_size=VOCAB)
    torch.manual_seed(0)
    model, hidden = loaded.model, loaded.model.config.hidden_size
    model.model.embed_tokens = torch.nn.Embedding(VOCAB, hidden)
    model.lm_head = torch.nn.Linear(hidden, VOCAB, bias=False)
    torch.nn.init.normal_(model.lm_head.weight, std=3 / hidden ** 0.5)
    return loaded


@pytest.fixture(scope="module")
def prompts():
    """Lengths 38, 22, 1 and 55; each repeats its head, so n-gram drafters find matches."""
    g = torch.Generator().manual_seed(0)
    out = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (23, 7, 40)]
    return [p[:5] * 3 + p for p in out[:2]] + [[9]] + [out[2][:5] * 3 + out[2]]


BATCHES = {1: [0], 2: [1, 2], 4: [0, 1, 2, 3]}  # prompt indices per batch size


def decoder(target, drafter, cls=Decoder, acceptance=None, sampling=SamplingParams(), max_new=MAX_NEW, eos=(),
            seed=0):
    return cls(target.model, drafter, acceptance or ExactAcceptance(), sampling, max_new, eos, seed=seed,
               max_context=target.max_context)


@pytest.fixture(scope="module")
def plain(target, prompts):
    return [decoder(target, PlainDrafter()).generate(p).tokens for p in prompts]


@pytest.fixture(scope="module")
def medusa_artifact(tmp_path_factory, target):
    return str(random_medusa_artifact(tmp_path_factory.mktemp("medusa") / "m.safetensors", target,
                                      [row[:3] for row in ACC]))


@pytest.fixture(scope="module")
def ppd_artifact(tmp_path_factory, target):
    torch.manual_seed(2)
    tokens = PromptTokens(3, 2, target.model.config.hidden_size)
    torch.nn.init.normal_(tokens.weight, std=0.5)
    arch = {"hidden_size": target.model.config.hidden_size, "num_prompt_tokens": 3, "num_ensemble": 2}
    return str(save_artifact(tmp_path_factory.mktemp("ppd") / "p.safetensors", "ppd", target, arch,
                             tokens.state_dict(), metrics={"rank_accuracy": ACC}))


class OraclePPD(PPDDrafter):
    """PPD whose guesses are the true continuation (random prompt tokens never get a draft accepted on the tiny
    model), so commits of trees that carry prompt-token rows are checked too."""

    def __init__(self, target, tree, checkpoint, continuations: dict[tuple[int, ...], list[int]]) -> None:
        super().__init__(target, tree, checkpoint)
        self.continuations = continuations

    def propose(self, state):
        if self._probs is not None:
            out = self.continuations[tuple(state.tokens[: state.prompt_len])]
            done = len(state.tokens) - state.prompt_len  # the root is out[done - 1]
            guesses = [out[min(done - 1 + d, len(out) - 1)] for d in range(1, self.m + 1)]
            self._probs = torch.nn.functional.one_hot(torch.tensor(guesses), VOCAB).float()
        return super().propose(state)


METHODS = {
    "plain": lambda t, arts: PlainDrafter(),
    "pld": lambda t, arts: PromptLookupDrafter(t, NativePolicy(8)),
    "sssd-input": lambda t, arts: SSSDDrafter(t, NativePolicy(12), sources=["input"]),
    "medusa": lambda t, arts: MedusaDrafter(t, GreedyPolicy(10, accept_prob=None), arts["medusa"]),
    "ppd": lambda t, arts: PPDDrafter(t, NativePolicy(16), arts["ppd"]),
    "ppd-oracle": lambda t, arts: OraclePPD(t, NativePolicy(16), arts["ppd"], arts["continuations"]),
    "draft_model": lambda t, arts: DraftModelDrafter(t, DynamicPolicy(budget=8, top_k=2, depth=3),
                                                     early_exit_layers=1),
}


def build(method, target, prompts, plain, medusa_artifact, ppd_artifact):
    continuations = {tuple(p): out for p, out in zip(prompts, plain)}
    return METHODS[method](target, {"medusa": medusa_artifact, "ppd": ppd_artifact, "continuations": continuations})


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_batch_equals_decoder_and_plain_decoding(target, prompts, plain, medusa_artifact,
                                                        ppd_artifact, method):
    drafter = build(method, target, prompts, plain, medusa_artifact, ppd_artifact)
    if method != "plain":
        assert [decoder(target, drafter).generate(p).tokens for p in prompts] == plain
    accepted = 0
    for b, ids in BATCHES.items():
        batch = decoder(target, drafter, BatchDecoder).generate_batch([prompts[i] for i in ids])
        assert [g.tokens for g in batch] == [plain[i] for i in ids], f"b={b}"
        assert all(len(g.tokens) == MAX_NEW for g in batch)
        accepted += sum(s.accepted for g in batch for s in g.steps)
    assert (accepted > 0) == (method not in ("plain", "ppd"))  # drafts were really accepted


@pytest.mark.parametrize("method", list(METHODS))
def test_sampling_batch_equals_the_single_decoder_with_the_same_seed(target, prompts, plain,
                                                                     medusa_artifact, ppd_artifact, method):
    """Every drafter here drafts deterministically, so each sequence draws the same random numbers as the b=1
    Decoder: the same tokens, and the same target probabilities for them (which a stale or foreign cache entry
    would shift even where greedy tokens survive it)."""
    drafter = build(method, target, prompts, plain, medusa_artifact, ppd_artifact)
    sampling, rule = SamplingParams(temperature=0.8, top_p=0.95), RejectionSampling()
    single = [decoder(target, drafter, acceptance=rule, sampling=sampling, seed=3).generate(p) for p in prompts]
    assert len({tuple(g.tokens) for g in single}) == len(prompts)
    for b, ids in BATCHES.items():
        batch = decoder(target, drafter, BatchDecoder, acceptance=rule, sampling=sampling, seed=3).generate_batch(
            [prompts[i] for i in ids])
        for g, i in zip(batch, ids):
            assert g.tokens == single[i].tokens, f"b={b}"
            assert g.token_logprobs == pytest.approx(single[i].token_logprobs, abs=1e-4)
            # the step records mean the same as the single decoder's: rows verified (PPD's prompt tokens included),
            # accepted drafts, and whether a deeper level was tried
            assert [(s.tree_size, s.accepted, s.tried_deeper) for s in g.steps] == [
                (s.tree_size, s.accepted, s.tried_deeper) for s in single[i].steps], f"b={b}"


def test_sequences_stop_on_their_own(target, prompts, plain):
    """Sequence 1 hits EOS early while the others go on; the others hit max_new_tokens."""
    stop = plain[1][3]
    ids = [0, 1, 3]
    assert all(stop not in plain[i] for i in (0, 3))
    drafter = PromptLookupDrafter(target, NativePolicy(8))
    bd = decoder(target, drafter, BatchDecoder, eos=[stop], max_new=MAX_NEW + 5)
    batch = bd.generate_batch([prompts[i] for i in ids])
    single = [decoder(target, drafter, eos=[stop], max_new=MAX_NEW + 5).generate(prompts[i]) for i in ids]
    assert [g.tokens for g in batch] == [g.tokens for g in single]
    early, *rest = batch[1], batch[0], batch[2]
    assert early.tokens[-1] == stop and len(early.tokens) == plain[1].index(stop) + 1
    assert all(len(g.tokens) == MAX_NEW + 5 for g in rest)
    assert all(len(early.steps) < len(g.steps) and early.wall_time < g.wall_time for g in rest)
    sizes = [s.batch_size for s in bd.last_run.steps]
    assert sizes[0] == 3 and sizes[-1] < 3 and sizes == sorted(sizes, reverse=True)


def test_a_sequence_near_the_context_end_stops_cleanly_beside_a_short_one(target, prompts):
    long = [5, 6, 7] * ((target.max_context - 10) // 3)
    drafter = PromptLookupDrafter(target, NativePolicy(8))
    batch = decoder(target, drafter, BatchDecoder, max_new=64).generate_batch([long, prompts[1]])
    assert len(long) + len(batch[0].tokens) == target.max_context
    ar = decoder(target, PlainDrafter(), max_new=64)
    assert [g.tokens for g in batch] == [ar.generate(long).tokens, ar.generate(prompts[1]).tokens]


def test_batch_records(target, prompts):
    bd = decoder(target, PromptLookupDrafter(target, NativePolicy(8)), BatchDecoder)
    batch = bd.generate_batch(prompts)
    run = bd.last_run
    assert run.batch_size == 4 and run.wall_time >= run.prefill_time > 0 and run.kv_peak_bytes > 0
    assert run.tokens >= sum(len(g.tokens) for g in batch)
    for s in run.steps:
        assert 1 <= s.rows <= 8 and s.verify_time > 0 and s.step_time >= s.verify_time
        assert s.cache_len <= max(len(p) for p in prompts) + MAX_NEW
    for g in batch:
        assert g.prefill_time == run.prefill_time and g.prefill_time < g.wall_time <= run.wall_time
        assert 0 < g.kv_peak_bytes < run.kv_peak_bytes
        assert all(s.verify_time > 0 and s.draft_time >= 0 for s in g.steps)


def test_verify_batch_gives_each_sequence_its_own_verify_tree_logits(target):
    """Two trees on prefixes of different lengths, then a commit of different paths, then a second step: every
    row's logits equal the single-sequence forward's."""
    model = target.model
    prefixes = [[5, 9, 12, 40, 3, 3, 7], [11, 2]]
    steps = [[TokenTree([1, 4, 6, 8, 9], [-1, 0, 0, 1, 3]), TokenTree([2, 7, 7], [-1, 0, 1])],
             [TokenTree([3, 5, 6], [-1, 0, 0]), TokenTree([4, 1, 2, 3, 4, 5], [-1, 0, 1, 0, 3, 4])]]
    paths = [[[0, 1, 3], [0]], [[0, 2], [0, 3, 4, 5]]]
    batch_cache, singles = DynamicCache(), [DynamicCache() for _ in prefixes]
    with torch.inference_mode():
        prefill_batch(model, batch_cache, prefixes)
        for p, c in zip(prefixes, singles):
            model(input_ids=torch.tensor([p]), past_key_values=c, use_cache=True)
        committed = [len(p) for p in prefixes]
        for trees, step_paths, lengths in zip(steps, paths, [[10, 3], [12, 7]]):
            past_len = batch_cache.get_seq_length()
            outs = verify_batch(model, batch_cache, trees, committed)
            for tree, out, cache, path in zip(trees, outs, singles, step_paths):
                past = cache.get_seq_length()
                ref = verify_tree(model, cache, tree)
                torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=1e-4)
                commit_path(cache, past, path)
            committed = commit_batch(batch_cache, committed, past_len, step_paths)
            assert committed == [c.get_seq_length() for c in singles] == lengths
            assert batch_cache.get_seq_length() == max(committed)


def test_forks_share_weights_and_keep_their_own_state(target, medusa_artifact):
    drafter = DraftModelDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), early_exit_layers=1)
    a, b = fork_drafter(drafter), fork_drafter(drafter)
    assert a.draft is b.draft is drafter.draft and a.tree is not b.tree
    medusa = MedusaDrafter(target, GreedyPolicy(10, accept_prob=None), medusa_artifact)
    assert fork_drafter(medusa).heads is medusa.heads


def test_bad_input_is_refused_before_decoding(target, prompts):
    bd = decoder(target, PlainDrafter(), BatchDecoder)
    with pytest.raises(SpecbenchError, match="the prompt is empty"):
        bd.generate_batch([prompts[0], []])
    with pytest.raises(SpecbenchError, match="more than the model's context"):
        bd.generate_batch([prompts[0], [1] * target.max_context])
    assert bd.generate_batch([]) == []
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(SpecbenchError, match=f"eval.batch_size={bad!r} is invalid: it must be an integer >= 1"):
            validate_batch_size(bad)
    assert validate_batch_size(8) == 8
