"""Medusa heads: greedy exact acceptance reproduces autoregressive decoding token for token (fp32), the heads read
the verify forward's hidden states, and Medusa-2 trains LoRA adapters with the heads at a higher LR."""

import pytest
import torch

from specbench.acceptance.exact import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.errors import SpecbenchError
from specbench.tasks.train import train
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.static import StaticPolicy

from .conftest import compose_cfg, random_medusa_artifact
from .test_training import SMALL

PROMPTS = [[5, 17, 99, 3, 42, 42, 7], [200, 201, 202, 5, 5, 5, 5, 9], list(range(60, 90))]


@pytest.fixture(scope="module")
def heads_artifact(tmp_path_factory, tiny):
    acc = [[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]]
    return random_medusa_artifact(tmp_path_factory.mktemp("medusa") / "m.safetensors", tiny, acc)


def decode(tiny, drafter, prompt, n=40):
    return Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), n).generate(prompt)


@pytest.mark.parametrize("budget", [4, 12])
def test_medusa_greedy_output_equals_autoregressive(tiny, heads_artifact, budget):
    drafter = MedusaDrafter(tiny, GreedyPolicy(budget, accept_prob=None), str(heads_artifact))
    for prompt in PROMPTS:
        ar = decode(tiny, AutoregressiveDrafter(), prompt)
        gen = decode(tiny, drafter, prompt)
        assert gen.tokens == ar.tokens
        assert max(s.tree_size for s in gen.steps) == budget


def test_medusa_heads_predict_from_the_last_accepted_node(tiny, heads_artifact):
    """Exact drafts: heads whose guesses are the AR continuation get every draft accepted (tau = heads + 1)."""
    drafter = MedusaDrafter(tiny, StaticPolicy(choices=[[0], [0, 0], [0, 0, 0]]), str(heads_artifact))
    prompt = PROMPTS[0]
    ar = decode(tiny, AutoregressiveDrafter(), prompt, n=30).tokens
    positions = {}

    def oracle(hidden, lm_head):  # look the true continuation up by the hidden state's identity
        key = round(float(hidden.sum()), 3)
        i = positions[key]
        out = torch.full((3, tiny.model.config.vocab_size), -1e4)
        for k in range(3):
            if i + k + 1 < len(ar):
                out[k, ar[i + k + 1]] = 0.0
        return out

    with torch.inference_mode():
        seq = torch.tensor([prompt + ar])
        hidden = tiny.model(seq, output_hidden_states=True).hidden_states[-1][0]
    for i in range(len(ar)):
        positions[round(float(hidden[len(prompt) - 1 + i].sum()), 3)] = i
    drafter.heads = oracle
    gen = decode(tiny, drafter, prompt, n=30)
    assert gen.tokens == ar and gen.accept_lengths[:5] == [4] * 5


def test_a_tree_deeper_than_the_heads_is_refused(tiny, heads_artifact):
    drafter = MedusaDrafter(tiny, StaticPolicy(choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]), str(heads_artifact))
    with pytest.raises(SpecbenchError, match="3 heads"):
        decode(tiny, drafter, PROMPTS[0])


def test_medusa2_trains_lora_adapters_and_heads_at_4x_lr(tmp_path, tiny):
    cfg = compose_cfg(["method=medusa", *SMALL, "method.train.module.joint=true", "method.train.max_steps=2",
                       "method.train.module.lora.r=4"], tmp_path)
    summary = train(cfg, tmp_path)
    assert (tmp_path / "lora_adapter" / "adapter_config.json").exists()
    heads_only = compose_cfg(["method=medusa", *SMALL, "method.train.max_steps=2"], tmp_path / "m1")
    assert summary["trainable_params"] > train(heads_only, tmp_path / "m1")["trainable_params"]
    from specbench.models import tiny_random
    from specbench.training.medusa import MedusaModule

    module = MedusaModule(tiny_random().model, joint=True, lora={"r": 4, "target_modules": ["q_proj"]}, lr=1e-4)
    heads_group, lora_group = module.param_groups()
    assert heads_group["lr"] == 4e-4 and lora_group["lr"] == 1e-4
    assert all("lora" in n for n, p in module.backbone.named_parameters() if p.requires_grad)
    drafter = MedusaDrafter(tiny, GreedyPolicy(8, accept_prob=None), summary["artifact"])
    assert decode(tiny, drafter, PROMPTS[1]).tokens == decode(tiny, AutoregressiveDrafter(), PROMPTS[1]).tokens
