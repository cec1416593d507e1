"""The draft-model drafter: fp32 greedy output equals plain decoding, its own KV cache stays exact through
many rollbacks, sampling records the true draft distribution, and mismatched drafts are refused clearly."""

from __future__ import annotations

import copy

import pytest
import torch
from hydra.utils import instantiate
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.acceptance.rejection import RejectionSampling
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.base import DecodeState
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter
from specbench.models.early_exit import early_exit
from specbench.models.loading import LoadedModel
from specbench.models.tiny import tiny_random
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.static import StaticPolicy

from .conftest import compose_cfg

VOCAB = 64


def lively_tiny(seed: int = 0, num_layers: int = 3) -> LoadedModel:
    """tiny_random with an untied embedding and LM head, so its greedy output depends on the context."""
    loaded = tiny_random(num_layers=num_layers, vocab_size=VOCAB, seed=seed)
    torch.manual_seed(seed)
    model, hidden = loaded.model, loaded.model.config.hidden_size
    model.model.embed_tokens = torch.nn.Embedding(VOCAB, hidden)
    model.lm_head = torch.nn.Linear(hidden, VOCAB, bias=False)
    torch.nn.init.normal_(model.lm_head.weight, std=3 / hidden ** 0.5)
    return loaded


def noisy_copy(loaded: LoadedModel, noise: float = 0.4) -> LoadedModel:
    """A draft that agrees with the target often but not always: drafts get accepted and rolled back."""
    draft = copy.deepcopy(loaded)
    torch.manual_seed(1)
    with torch.no_grad():
        draft.model.lm_head.weight.add_(noise * torch.randn_like(draft.model.lm_head.weight) / 8 ** 0.5)
    draft.name = "noisy_draft"
    return draft


@pytest.fixture(scope="module")
def target():
    return lively_tiny()


PROMPTS = [[3, 17, 42, 8, 8, 30, 1], [60, 2, 2, 9, 33, 47, 12, 5, 19]]
TREES = {"chain": ChainPolicy(budget=5), "dynamic": DynamicPolicy(budget=11, top_k=3, depth=4),
         "static": StaticPolicy(choices=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]])}


@pytest.fixture(scope="module")
def greedy_outputs(target):
    decoder = Decoder(target.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 36)
    return [decoder.generate(prompt).tokens for prompt in PROMPTS]


@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("draft", ["separate", "early_exit"])
def test_greedy_output_equals_plain_decoding(target, greedy_outputs, shape, draft):
    kwargs = {"draft_model": noisy_copy(target)} if draft == "separate" else {"early_exit_layers": 1}
    drafter = DraftModelDrafter(target, TREES[shape], **kwargs)
    accepted = []
    for prompt, want in zip(PROMPTS, greedy_outputs):
        got = Decoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 36).generate(prompt)
        assert got.tokens == want
        accepted += [s.accepted for s in got.steps]
    if draft == "separate":  # the early-exit draft of a random model agrees with it on the greedy cycles it falls into
        assert len(set(accepted)) > 1 and max(accepted) >= 2, "drafts must be partly accepted and rolled back"


def test_draft_cache_holds_exactly_the_committed_prefix_after_many_rollbacks(target):
    drafter = DraftModelDrafter(target, TREES["dynamic"], draft_model=noisy_copy(target))
    gen = Decoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 48).generate(PROMPTS[0])
    committed = drafter._tokens  # the decoder's token list, including tokens past max_new_tokens
    kept = drafter.cache.get_seq_length()
    assert kept < len(committed) and len(gen.steps) > 10
    fresh = DynamicCache()
    with torch.no_grad():
        drafter.draft.model(input_ids=torch.tensor([committed[:kept]]), past_key_values=fresh, use_cache=True)
    for ours, ref in zip(drafter.cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys, ref.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, ref.values, atol=1e-5, rtol=1e-5)


def test_sampling_draws_children_from_q_and_records_it(target):
    draft = noisy_copy(target)
    drafter = DraftModelDrafter(target, ChainPolicy(budget=4), draft_model=draft, temperature=0.8, top_k=20)
    first_children = set()
    for seed in range(12):
        drafter.seed = seed
        state = DecodeState(tokens=list(PROMPTS[0]), prompt_len=len(PROMPTS[0]))
        drafter.reset(state)
        tree = drafter.propose(state)
        assert tree.draft_probs is not None
        for node in range(len(tree) - 1):  # each node's row is q after its path, recomputed from scratch
            context = PROMPTS[0] + tree.tokens[tree.path_to(node)[1:]].tolist()
            with torch.no_grad():
                logits = draft.model(torch.tensor([context])).logits[0, -1]
            torch.testing.assert_close(tree.draft_probs[node], SamplingParams(0.8, 1.0, 20).probs(logits),
                                       atol=1e-5, rtol=1e-4)
        first_children.add(int(tree.tokens[1]))
    assert len(first_children) > 1, "at temperature > 0 the draft must sample, not take its argmax"


def test_greedy_drafting_records_no_distribution(target):
    drafter = DraftModelDrafter(target, ChainPolicy(budget=4), early_exit_layers=1)
    state = DecodeState(tokens=list(PROMPTS[0]), prompt_len=len(PROMPTS[0]))
    drafter.reset(state)
    assert drafter.propose(state).draft_probs is None


def test_rejection_with_greedy_sampling_equals_plain_decoding(target):
    drafter = DraftModelDrafter(target, TREES["static"], draft_model=noisy_copy(target))
    want = Decoder(target.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 30).generate(PROMPTS[1])
    got = Decoder(target.model, drafter, RejectionSampling(), SamplingParams(), 30).generate(PROMPTS[1])
    assert got.tokens == want.tokens


def test_early_exit_shares_the_target_weights(target):
    draft = early_exit(target, 2)
    assert len(draft.model.model.layers) == 2 and len(target.model.model.layers) == 3
    assert draft.model.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    assert draft.model.model.layers[1].mlp.up_proj.weight.data_ptr() == \
        target.model.model.layers[1].mlp.up_proj.weight.data_ptr()
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        torch.testing.assert_close(early_exit(target, 3).model(ids).logits, target.model(ids).logits)
        assert not torch.allclose(draft.model(ids).logits, target.model(ids).logits)
    assert target.model.config.num_hidden_layers == 3  # the target is untouched


def test_early_exit_layer_count_is_checked(target):
    with pytest.raises(SpecbenchError, match="early_exit_layers=4 is invalid.*1..3"):
        early_exit(target, 4)


def test_an_early_exit_past_the_targets_layers_is_one_line_before_any_model_loads(tmp_path, monkeypatch):
    """The range was checked only at the draft's build, after the machine profile and the target's load."""
    from specbench.tasks import eval as eval_task

    monkeypatch.setattr(eval_task, "setup_target", lambda cfg: pytest.fail("a model loaded"))
    base = ["model=tiny_random", "method=draft_model", "method.checkpoint=null", "eval.num_prompts=1"]
    for layers in (3, 0):  # tiny_random has 2 layers
        with pytest.raises(SpecbenchError, match=rf"early_exit_layers={layers} is invalid: 'tiny_random' has 2 "
                                                 rf"layers, so use 1..2"):
            eval_task.run(compose_cfg([*base, f"method.draft.early_exit_layers={layers}"], tmp_path))


def test_mismatched_tokenizers_are_refused(target):
    other = copy.copy(target)
    other.tokenizer = copy.deepcopy(target.tokenizer)
    other.tokenizer.add_tokens(["<extra>"])
    other.name = "other_family"
    with pytest.raises(SpecbenchError, match="different tokenizer from target"):
        DraftModelDrafter(target, ChainPolicy(), draft_model=other)


def test_mismatched_vocabulary_sizes_are_refused(target):
    wider = tiny_random(num_layers=1, vocab_size=VOCAB + 8)
    with pytest.raises(SpecbenchError, match="outputs 72 logits"):
        DraftModelDrafter(target, ChainPolicy(), draft_model=wider)


def test_exactly_one_draft_must_be_chosen(target):
    with pytest.raises(SpecbenchError, match="exactly one draft"):
        DraftModelDrafter(target, ChainPolicy())
    with pytest.raises(SpecbenchError, match="exactly one draft"):
        DraftModelDrafter(target, ChainPolicy(), draft_model=target, early_exit_layers=1)


def test_config_builds_an_early_exit_or_a_model_group_draft(tiny, tmp_path):
    cfg = compose_cfg(["method=draft_model", "model=tiny_random", "method.checkpoint=null", "tree=dynamic", "accept=rejection",
                       "method.draft.early_exit_layers=1"], tmp_path)
    drafter = build_drafter(cfg.method.drafter, tiny, instantiate(cfg.tree))
    assert drafter.draft.name.endswith("[:1]") and drafter.parameters_bytes() == (0, 0)
    cfg = compose_cfg(["method=draft_model", "model=tiny_random", "method.checkpoint=null", "+model@method.draft.model=tiny_random",
                       "method.draft.early_exit_layers=null"], tmp_path)
    drafter = build_drafter(cfg.method.drafter, tiny, instantiate(cfg.tree))
    assert drafter.draft.model is not tiny.model and drafter.parameters_bytes()[0] > 0
