"""PPD: prompt-token chains ride in the verify forward without changing the committed output (fp32 greedy equals
plain decoding), they see exactly what training showed them, and the dynamic sparse tree fits its budget."""

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance.exact import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.trees.native import NativePolicy
from specbench.drafters.ppd import PPDDrafter, PromptTokens
from specbench.drafters.ppd_tree import dynamic_sparse_tree, hardware_aware_budget
from specbench.errors import SpecbenchError
from specbench.trees.hardware_aware import HardwareAwarePolicy
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
def test_ppd_greedy_output_equals_plain_decoding(tiny, prompt_artifact, budget):
    drafter = PPDDrafter(tiny, NativePolicy(budget), str(prompt_artifact))
    for prompt in PROMPTS:
        ar = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 40).generate(prompt)
        gen = Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), 40).generate(prompt)
        assert gen.tokens == ar.tokens
        # every row of the forward is counted; the prefill carried prompt tokens, so the first step already
        # verifies state T_m's whole tree (candidates and prompt tokens), not the root alone
        assert gen.steps[0].tree_size == drafter.states[drafter.m].rows(drafter.n_e) > 1 + drafter.m * drafter.n_e
        assert max(s.tree_size for s in gen.steps) <= budget


def test_prefill_guesses_are_those_a_root_alone_step_would_make(tiny, prompt_artifact):
    """The prompt tokens attached to the prefill sit where a step verifying the last prompt token as its root would
    put them: the same guesses (the old first step), without spending a forward on it; the cache keeps the prompt."""
    drafter = PPDDrafter(tiny, NativePolicy(12), str(prompt_artifact))
    prompt = PROMPTS[2]
    gen = Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), 1).generate(prompt)  # prefill only
    assert gen.steps == []
    cache = DynamicCache()
    with torch.inference_mode():
        tiny.model(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
        root = TokenTree.chain(prompt[-1], [])
        drafter._carried = [drafter.m]
        out = verify_tree(tiny.model, cache, root, False, *drafter.verify_extras(root))
    chains = out.logits[1:].reshape(drafter.n_e, drafter.m, -1)  # one chain of m prompt tokens per member
    expected = chains.mean(0).softmax(-1)
    torch.testing.assert_close(drafter._probs, expected, atol=1e-4, rtol=1e-4)


def test_no_room_for_prompt_tokens_at_prefill_falls_back_to_the_root(tiny, prompt_artifact):
    """A prompt whose prompt-token rows would reach past the context gets a plain prefill; the first step then
    verifies the root and its prompt tokens, and the output is still plain decoding's."""
    drafter = PPDDrafter(tiny, NativePolicy(12), str(prompt_artifact))
    prompt = PROMPTS[2]
    context = len(prompt) + drafter.m * drafter.n_e  # the prompt fits, its prompt-token rows do not
    ar = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 40,
                 max_context=context).generate(prompt)
    gen = Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), 40, max_context=context).generate(prompt)
    assert gen.tokens == ar.tokens
    assert gen.steps[0].tree_size == 1 + drafter.m * drafter.n_e


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


@pytest.mark.parametrize("latency, best", [(lambda n: n, 2), (lambda n: 10.0 + n, 6)])
def test_hardware_aware_size_from_hand_worked_rates(latency, best):
    """One prompt token, ranks 0/1 right half and a quarter of the time. Budget 2: the root and its prompt token,
    tau 1. Budgets 4 and 5: candidate [0] with its own prompt token (4 rows, one prompt token each is all m = 1
    allows), tau 1.5. Budget 6: candidates [0] and [1], 6 rows, tau 1.75. Under L(n) = n the rates are 1/2, 1.5/4,
    1.75/6: the root alone wins; under L(n) = 10 + n they are 1/12, 1.5/14, 1.75/16: the largest tree wins."""
    acc = [[0.5, 0.25]]
    n, rates = hardware_aware_budget(acc, 1, 1, 6, latency)
    taus = {2: 1.0, 3: 1.0, 4: 1.5, 5: 1.5, 6: 1.75}
    rows = {2: 2, 3: 2, 4: 4, 5: 4, 6: 6}
    assert rates == pytest.approx({k: taus[k] / latency(rows[k]) for k in taus})
    assert n == best


def test_tree_hardware_aware_sizes_ppd_from_its_artifact(tiny, prompt_artifact):
    """method=ppd tree=hardware_aware: tree.budget caps n*, every state's forward fits n*, decoding stays lossless;
    before the evaluator fits a latency curve there is nothing to size with."""
    unfitted = PPDDrafter(tiny, HardwareAwarePolicy(24), str(prompt_artifact))
    with pytest.raises(SpecbenchError, match="no latency curve"):
        Decoder(tiny.model, unfitted, ExactAcceptance(), SamplingParams(), 4).generate(PROMPTS[0])
    steep, flat = (PPDDrafter(tiny, HardwareAwarePolicy(24), str(prompt_artifact)) for _ in range(2))
    steep.fit(lambda n: float(n) ** 3)  # Drafter.fit: what the evaluator calls with this machine's L(n)
    flat.fit(lambda n: 1.0)
    assert steep.budget == 1 + steep.m * steep.n_e  # every extra row costs more than it can return
    assert steep.budget < flat.budget <= 24
    assert all(s.rows(flat.n_e) <= flat.budget for s in flat.states.values())
    prompt = PROMPTS[0]
    ar = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 30).generate(prompt)
    gen = Decoder(tiny.model, flat, ExactAcceptance(), SamplingParams(), 30).generate(prompt)
    assert gen.tokens == ar.tokens and max(s.tree_size for s in gen.steps) <= flat.budget
