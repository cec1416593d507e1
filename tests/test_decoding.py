import pytest
import torch

from specbench.trees.native import NativePolicy
from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.errors import SpecbenchError


def decode(tiny, drafter, prompt, max_new=48, eos=None, sampling=SamplingParams(), seed=0):
    eos = tiny.eos_token_ids if eos is None else eos
    return Decoder(tiny.model, drafter, ExactAcceptance(), sampling, max_new, eos, seed=seed,
                   max_context=tiny.max_context).generate(prompt)


def prompts(tiny):
    texts = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "x", "hello world " * 6]
    return [tiny.tokenizer(t)["input_ids"] for t in texts]


@pytest.mark.parametrize("pld, budget", [(dict(), 11), (dict(max_ngram=1), 4), (dict(max_ngram=5), 21)])
def test_pld_greedy_equals_plain_decoding(tiny, pld, budget):
    speculated = 0
    for prompt in prompts(tiny):
        ar = decode(tiny, PlainDrafter(), prompt)
        out = decode(tiny, PromptLookupDrafter(tiny, NativePolicy(budget), **pld), prompt)
        assert out.tokens == ar.tokens
        assert all(s.tree_size == 1 for s in ar.steps) and len(ar.steps) == len(ar.tokens) - 1
        speculated += sum(s.accepted for s in out.steps)
    assert speculated > 0  # the drafts were really accepted, not just rejected every time


def test_sampling_runs_stay_within_the_budget(tiny):
    for prompt in prompts(tiny):
        out = decode(tiny, PromptLookupDrafter(None, NativePolicy(11)), prompt, sampling=SamplingParams(temperature=0.8), seed=3)
        assert 1 <= len(out.tokens) <= 48


def test_decoding_stops_at_eos_and_max_new_tokens(tiny):
    prompt = prompts(tiny)[0]
    ar = decode(tiny, PlainDrafter(), prompt, max_new=30, eos=[])
    assert len(ar.tokens) == 30
    stop = ar.tokens[10]
    first = ar.tokens.index(stop)
    for drafter in (PlainDrafter(), PromptLookupDrafter(None, NativePolicy(11))):
        out = decode(tiny, drafter, prompt, max_new=30, eos=[stop])
        assert out.tokens == ar.tokens[: first + 1]


def test_a_prompt_longer_than_the_context_is_refused(tiny):
    with pytest.raises(SpecbenchError, match="more than the model's context"):
        decode(tiny, PlainDrafter(), [1] * tiny.max_context)


def test_decoding_near_the_context_end_stops_cleanly(tiny):
    prompt = [5] * (tiny.max_context - 8)
    out = decode(tiny, PromptLookupDrafter(None, NativePolicy(11)), prompt, max_new=64)
    assert len(prompt) + len(out.tokens) <= tiny.max_context
    ar = decode(tiny, PlainDrafter(), prompt, max_new=64)
    assert out.tokens == ar.tokens


def test_step_records_time_every_phase(tiny):
    out = decode(tiny, PromptLookupDrafter(None, NativePolicy(11)), prompts(tiny)[0])
    assert out.prefill_time > 0 and out.wall_time >= out.prefill_time
    for s in out.steps:
        assert 0 <= s.draft_time and 0 < s.verify_time <= s.step_time
    assert out.kv_peak_bytes > 0
    assert sum(out.accept_lengths) == len(out.tokens) - 1 or len(out.tokens) == 48


def test_sampling_parameters_are_validated():
    with pytest.raises(SpecbenchError, match="temperature"):
        SamplingParams(temperature=-0.1)
    for bad in (0.0, 1.5):
        with pytest.raises(SpecbenchError, match="top_p"):
            SamplingParams(temperature=1.0, top_p=bad)


def test_top_k_and_top_p_shape_the_distribution():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert (SamplingParams(temperature=1.0, top_k=2).probs(logits)[2:] == 0).all()
    p = SamplingParams(temperature=1.0, top_p=0.5).probs(logits)
    assert p[0] == 1.0  # the top token alone already holds more than half the mass
    assert torch.allclose(SamplingParams(temperature=1.0).probs(logits).sum(), torch.tensor(1.0))


def test_the_prefill_projects_only_the_prompts_last_row_onto_the_vocabulary(tiny):
    """The engines project a prompt's last row alone; every row's logits would cost a vocabulary projection of the
    whole prompt, which a long prompt's prefill pays for nothing. The answer is the plain one either way."""
    rows = []
    forward = tiny.model.forward

    def counting(*args, **kwargs):
        out = forward(*args, **kwargs)
        rows.append(out.logits.shape[1])
        return out

    prompt = prompts(tiny)[0]
    reference = decode(tiny, PlainDrafter(), prompt, max_new=4)
    tiny.model.forward = counting
    try:
        out = decode(tiny, PlainDrafter(), prompt, max_new=4)
    finally:
        del tiny.model.forward
    assert len(prompt) > 1 and rows[0] == 1 and out.tokens == reference.tokens
