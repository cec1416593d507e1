"""PPD: prompt-token chains ride in the verify forward without changing the committed output (fp32 greedy equals
autoregressive decoding), they see exactly what training showed them, and the dynamic sparse tree fits its budget."""

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance.exact import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.autoregressive import AutoregressiveDrafter
from specbench.trees.native import NativePolicy
from specbench.drafters.ppd import PPDDrafter, PromptTokens
from specbench.drafters.ppd_tree import dynamic_sparse_tree
from specbench.models.artifact import save_artifact
from specbench.training.ppd import PPDModule
from specbench.trees.token_tree import TokenTree
from specbench.verification import verify_tree

ACC = [[0.5, 0.2, 0.1, 0.05], [0.4, 0.2, 0.1, 0.05], [0.3, 0.1, 0.1, 0.05]]
PROMPTS = [[5, 17, 99, 3, 42, 42, 7], [200, 201, 202, 5, 5, 5, 5, 9], list(range(60, 90))]


@pytest.fixture(scope="module", params=[1, 2], ids=["n_e=1", "n_e=2"])
def prompt_artifact(request, tmp_path_factory, tiny):
    torch.manual_seed(2)
    prompts = PromptTokens(3, request.param, tiny.model.config.hidden_size)
    torch.nn.init.normal_(prompts.weight, std=0.5)
    arch = {"hidden_size": tiny.model.config.hidden_size, "num_prompt_tokens": 3, "num_ensemble": request.param}
    return save_artifact(tmp_path_factory.mktemp("ppd") / "p.safetensors", "ppd", tiny, arch, prompts.state_dict(),
                         metrics={"rank_accuracy": ACC})


@pytest.mark.parametrize("budget", [12, 24])
def test_ppd_greedy_output_equals_autoregressive(tiny, prompt_artifact, budget):
    drafter = PPDDrafter(tiny, NativePolicy(budget), str(prompt_artifact))
    for prompt in PROMPTS:
        ar = Decoder(tiny.model, AutoregressiveDrafter(), ExactAcceptance(), SamplingParams(), 40).generate(prompt)
        gen = Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), 40).generate(prompt)
        assert gen.tokens == ar.tokens
        # every row of the forward is counted: after prefill the root and its m * n_e prompt tokens, then trees
        # whose candidates and prompt tokens together fill at most the budget
        assert gen.steps[0].tree_size == 1 + drafter.m * drafter.n_e
        assert max(s.tree_size for s in gen.steps) <= budget and max(s.tree_size for s in gen.steps) > gen.steps[0].tree_size


def test_prompt_token_chains_see_what_training_showed_them(tiny):
    """Inference (verify_tree extras on the cache) and training (PPDModule's two-pass forward) give prompt token k
    the same logits: position c-1+k, the prefix and the earlier prompt tokens of its own chain."""
    torch.manual_seed(3)
    module = PPDModule(tiny.model, num_prompt_tokens=3, cuts_per_sequence=1).float()
    torch.nn.init.normal_(module.prompts.weight, std=0.5)
    ids = torch.tensor([[11, 12, 13, 14, 15, 16, 17, 18, 19, 20]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids).bool()}
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        student, _, valid = module._forward(batch, generator)
    cut = int(module._cut_points(batch["loss_mask"], torch.Generator().manual_seed(0))[0][0, 0])
    cache = DynamicCache()
    with torch.inference_mode():
        tiny.model(input_ids=ids[:, : cut - 1], past_key_values=cache, use_cache=True)
        out = verify_tree(tiny.model, cache, TokenTree.chain(int(ids[0, cut - 1]), []), False,
                          module.prompts.weight[:, 0].detach(), torch.tensor([0, 1, 2]))
    assert valid.all()
    torch.testing.assert_close(out.logits[1:], student[0, 0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("budget", [8, 16, 32])
def test_dynamic_sparse_tree_fits_the_budget_and_each_state_its_depth(budget):
    states = dynamic_sparse_tree(ACC, 3, budget)
    assert set(states) == {1, 2, 3}
    for k, state in states.items():
        assert 1 + len(state.paths) + sum(state.carried) <= budget
        assert all(len(p) <= k for p in state.paths) and state.carried[0] == 3
        assert all(1 <= c <= 3 for c in state.carried)
        if state.paths:  # node i of the built tree is path i-1 (the prompt-token counts rely on it)
            tree = state.policy.build(0, _Uniform())
            assert [int(d) for d in tree.depths[1:]] == [len(p) for p in state.paths]
    assert states[3].value >= states[1].value


class _Uniform:
    def expand(self, tree, nodes):
        return torch.linspace(1.0, 0.1, 50).repeat(len(nodes), 1)
