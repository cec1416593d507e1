"""model.attention: transformers' eager attention in measured windows of key counts, SDPA elsewhere, with SDPA's
logits."""

import json
import random

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.errors import SpecbenchError
from specbench.hardware.measured import attention as measured
from specbench.models import tiny_random
from specbench.execution.attention import attention_tag, with_attention
from specbench.sampling import SamplingParams
from specbench.trees.native import NativePolicy
from specbench.verification import verify_tree

from .test_verification import random_tree


def switched(windows: list | str):
    """A fresh fp32 tiny model (the same weights as every other) that runs eager attention in `windows` ('eager':
    model.attention=eager, at every key count)."""
    if windows == "eager":
        return with_attention(tiny_random(dtype="float32"), "eager")
    return with_attention(tiny_random(dtype="float32"), "auto", {"float32": windows, "bfloat16": windows})


def test_eager_runs_between_measured_contexts_where_it_won_at_both_ends():
    ms = lambda pairs: {c: (s / 1e3, e / 1e3) for c, (s, e) in pairs.items()}  # noqa: E731
    zen4_bf16 = {128: (0.078, 0.113), 256: (0.144, 0.130), 384: (0.268, 0.178), 1024: (0.690, 0.210),
                 1536: (0.874, 0.256), 1792: (1.014, 1.362), 4096: (2.249, 3.760)}  # ms per layer, measured
    assert measured.windows_of(ms(zen4_bf16)) == [[384, 1536]]  # 256 within the margin; 1536 won, 1792 lost
    assert measured.windows_of(ms({128: (1, 2), 512: (5, 2), 1024: (17, 3.6)})) == [[512, None]]  # to no end
    assert measured.windows_of(ms({128: (2, 1), 512: (5, 6), 1024: (17, 3.6)})) == [[1024, None]]  # one end only
    assert measured.windows_of(ms({128: (2, 1), 256: (2, 1), 512: (5, 6), 1024: (1, 3)})) == [[128, 256]]
    assert measured.windows_of(ms({128: (1, 0.95)})) == []  # within the margin: no switch on noise


@torch.inference_mode()
@pytest.mark.parametrize("windows", [[[1, None]], [[9, None]], [[5, 12], [24, 30]], "eager"])
def test_switched_attention_gives_sdpas_logits_in_prefill_decode_and_tree_verify(windows):
    """Before, across and after the switch, and with model.attention=eager: a causal prefill (no mask: eager needs
    one built), one-token steps and a tree verify (a 4D boolean mask: eager needs it additive) equal SDPA's logits."""
    ref, model = tiny_random(dtype="float32").model, switched(windows).model
    assert model.config._attn_implementation == "specbench_switch"
    rng = random.Random(len(windows) + (windows[0][0] if windows != "eager" else 0))
    vocab = ref.config.vocab_size
    for trial in range(6):
        prefix = torch.tensor([[rng.randrange(vocab) for _ in range(rng.randint(4, 20))]])
        caches = DynamicCache(), DynamicCache()
        outs = [m(input_ids=prefix, past_key_values=c, use_cache=True).logits for m, c in zip((ref, model), caches)]
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)
        for _ in range(rng.randint(1, 8)):
            tok = torch.tensor([[rng.randrange(vocab)]])
            outs = [m(input_ids=tok, past_key_values=c, use_cache=True).logits for m, c in zip((ref, model), caches)]
            torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)
        tree = random_tree(rng, vocab, rng.randint(2, 10))
        torch.testing.assert_close(verify_tree(model, caches[1], tree).logits, verify_tree(ref, caches[0], tree).logits,
                                   atol=1e-5, rtol=0)


@torch.inference_mode()
def test_pld_with_the_switch_mid_answer_decodes_what_plain_decoding_does():
    prompt = tiny_random().tokenizer("the cat sat on the mat and the cat sat on the")["input_ids"]
    target = switched([[len(prompt) + 12, len(prompt) + 25]])  # eager for a stretch of the answer, SDPA around it

    def decode(drafter):
        return Decoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 40, [],
                       max_context=target.max_context).generate(prompt)
    plain, pld = decode(PlainDrafter()), decode(PromptLookupDrafter(target, NativePolicy(11)))
    assert pld.tokens == plain.tokens and any(s.tree_size > 1 for s in pld.steps)


def test_a_run_names_its_attention_and_profiles_are_kept_apart_per_attention(tiny):
    assert attention_tag(tiny) == "sdpa"
    assert attention_tag(switched([])) == "sdpa"  # auto that never switches runs SDPA
    assert attention_tag(switched([[384, 1536], [4096, None]])) == ("bfloat16_eager384-1536+4096-,"
                                                                    "float32_eager384-1536+4096-")
    assert attention_tag(with_attention(tiny_random(dtype="float32"), "eager")) == "eager"
    with pytest.raises(SpecbenchError, match="model.attention='flash' is unknown; valid choices: auto, sdpa, eager"):
        with_attention(tiny_random(dtype="float32"), "flash")


def test_the_windows_are_measured_once_per_machine_and_a_broken_cache_is_measured_again(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(measured, "CONTEXTS", (64, 128))
    model = tiny_random(dtype="float32").model
    first = measured.eager_windows(model, ["float32"])
    files = list((tmp_path / "profiles").glob("*-attention-*.json"))
    assert len(files) == 1 and set(json.loads(files[0].read_text())["timings"]["float32"]) == {"64", "128"}
    assert "measuring" in capsys.readouterr().out
    assert measured.eager_windows(model, ["float32"]) == first and "measuring" not in capsys.readouterr().out
    files[0].write_text('{"eager_windows": {"float32": [[64, 32]]}}')
    measured.eager_windows(model, ["float32"])
    out = capsys.readouterr().out
    assert "notice: the cached machine profile" in out and "[[64, 32]]" in out and "measuring" in out
