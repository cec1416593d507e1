"""EAGLE: fp32 greedy decoding equals plain decoding under every tree it accepts; every draft row (tree
rows, the cache after many rollbacks, the training-time test's unrolled steps) equals drafting its path alone; the
reduced vocabulary maps back to the right target ids; rejection sampling with EAGLE keeps the target's distribution;
task=train writes an artifact the drafter loads and decodes losslessly with."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import DynamicCache

from specbench.acceptance.exact import ExactAcceptance
from specbench.acceptance.rejection import RejectionSampling
from specbench.batching import BatchDecoder
from specbench.decoding import Decoder
from specbench.drafters.base import DecodeState
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.eagle import LEVEL_ROWS, ROOT_ROWS, EagleDrafter, EagleHead, feature_layers
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter
from specbench.execution.backends import PackedLinear
from specbench.models.artifact import load_artifact, save_artifact
from specbench.sampling import SamplingParams
from specbench.tasks.train import train
from specbench.training.datamodule import ShareGPTDataModule
from specbench.training.eagle import EagleModule, tau_sim, ttt_mask
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.hardware_aware import HardwareAwarePolicy, best_budget
from specbench.trees.policy import TreePolicy
from specbench.trees.static import StaticPolicy
from specbench.verification.tree_forward import selected_hidden

from . import test_rejection as rej
from .conftest import compose_cfg
from .test_draft_model import lively_tiny
from .test_training import SMALL

PROMPTS = [[3, 17, 42, 8, 8, 30, 1], [60, 2, 2, 9, 33, 47, 12, 5, 19]]
TREES = {"dynamic": DynamicPolicy(budget=11, top_k=3, depth=4), "chain": ChainPolicy(budget=5),
         "static": StaticPolicy(choices=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]),
         "greedy": GreedyPolicy(8, accept_prob=None)}


def eagle_artifact(path, target, features: str = "fused", d2t: list[int] | None = None, seed: int = 0,
                   sharpness: float = 0.3):
    """An artifact of a randomly initialised head (its draft vocabulary d2t; None: the whole vocabulary)."""
    torch.manual_seed(seed)
    cfg = target.model.config
    layers = feature_layers(cfg.num_hidden_layers, features)
    head = EagleHead(cfg, layers, len(d2t) if d2t else cfg.vocab_size)
    if d2t:
        head.d2t.copy_(torch.tensor(d2t))
    for p in head.parameters():  # sharper than the default init, so the draft's top-k is not a near tie
        torch.nn.init.normal_(p, std=sharpness / cfg.hidden_size ** 0.5 if p.ndim > 1 else 1.0)
    arch = {"features": features, "feature_layers": list(layers), "draft_vocab": head.lm_head.out_features}
    return save_artifact(path, "eagle", target, arch, head.state_dict(),
                         metrics={"rank_accuracy": [[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]]})


@torch.no_grad()
def with_features(module, batch: dict) -> dict:
    """batch with the target's hidden states the module trains on, as the feature cache would hand them."""
    out = module.backbone.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                output_hidden_states=module.hidden_states)
    return batch | {"hidden": {i: out.hidden_states[i] for i in module.hidden_states}}


def fitted_artifact(path, target, features: str, steps: int = 60):
    """A head fitted for a few seconds to the target's greedy continuations, so that drafts get accepted (and
    rolled back): accepted paths are what the drafter feeds back with the target's features."""
    torch.manual_seed(0)
    module = EagleModule(target.model, features=features, export_dtype="float32")
    prompts = torch.randint(0, target.model.config.vocab_size, (8, 6)).tolist()
    ids = torch.tensor([p + decode(target, PlainDrafter(), p, n=30).tokens for p in prompts])
    batch = with_features(module, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                   "loss_mask": torch.ones_like(ids).bool()})
    opt = torch.optim.Adam(module.head.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = sum(F.cross_entropy(logits, teacher.argmax(-1)) for _, logits, teacher, _ in module.unroll(batch))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return save_artifact(path, "eagle", target, module.arch(), module.export_tensors(),
                         metrics={"rank_accuracy": [[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]]})


@pytest.fixture(scope="module")
def target():
    return lively_tiny()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, target):
    folder = tmp_path_factory.mktemp("eagle")
    return {f: fitted_artifact(folder / f"{f}.safetensors", target, f) for f in ("fused", "last")}


def decode(target, drafter, prompt, n=36, acceptance=None, sampling=None, seed=0):
    return Decoder(target.model, drafter, acceptance or ExactAcceptance(), sampling or SamplingParams(), n,
                   seed=seed).generate(prompt)


@torch.no_grad()
def reference_chain(head, target, prompt: list[int], root: int, path: list[int]) -> torch.Tensor:
    """Draft probabilities (over the draft vocabulary) after root + path, drafted on a fresh cache one position at a
    time: the prompt's rows with the target's features, then each path token with the drafter's own feature."""
    model = target.model
    out = model.model(input_ids=torch.tensor([prompt]), output_hidden_states=head.layers)
    embed = model.get_input_embeddings()
    cache = DynamicCache()
    feature = head(head.fuse(selected_hidden(out, head.layers)), embed(torch.tensor([prompt[1:] + [root]])),
                   past_key_values=cache)[:, -1:]
    for token in path:
        feature = head(feature, embed(torch.tensor([[token]])), past_key_values=cache)
    return head.lm_head(feature[0, -1]).float().softmax(-1)


class Recording(TreePolicy):
    """A policy that records the distribution the drafter returned after every node, keyed by its path tokens."""

    def __init__(self, inner: TreePolicy) -> None:
        super().__init__(inner.budget)
        self.inner, self.probs = inner, {}

    def build(self, root, expander):
        policy, self.probs = self, {}  # the last tree's only

        class Recorder:
            generator = getattr(expander, "generator", None)

            def expand(self, tree, nodes):
                out = expander.expand(tree, nodes)
                policy.probs |= {tuple(tree.path_tokens(n)): p for n, p in zip(nodes, out)}
                return out

        return self.inner.build(root, Recorder())


@pytest.mark.parametrize("features", ["fused", "last"])
@pytest.mark.parametrize("shape", list(TREES))
def test_greedy_output_equals_plain_decoding(target, artifacts, shape, features):
    drafter = EagleDrafter(target, TREES[shape], str(artifacts[features]))
    accepted = []
    for prompt in PROMPTS:
        want = decode(target, PlainDrafter(), prompt).tokens
        got = decode(target, drafter, prompt)
        assert got.tokens == want
        assert max(s.tree_size for s in got.steps) == TREES[shape].budget
        accepted += [s.accepted for s in got.steps]
    assert len(set(accepted)) > 1 and max(accepted) >= 2, "drafts must be partly accepted and rolled back"


def test_batched_decoding_equals_the_single_decoder(target, artifacts):
    """BatchDecoder forks the drafter per sequence; its batched prefill hands each fork its prompt's features."""
    drafter = EagleDrafter(target, TREES["dynamic"], str(artifacts["fused"]))
    single = [decode(target, drafter, prompt) for prompt in PROMPTS]
    batch = BatchDecoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 36).generate_batch(PROMPTS)
    assert [g.tokens for g in batch] == [g.tokens for g in single]
    assert [g.accept_lengths for g in batch] == [g.accept_lengths for g in single]


def test_the_prefill_projects_only_the_last_prompt_row_and_hands_the_head_every_rows_features(target, artifacts,
                                                                                             monkeypatch):
    """EAGLE's head needs the target's features at every prompt position, not the logits there: the prefill, like
    plain decoding's, projects only the last row onto the vocabulary."""
    calls = []
    forward = type(target.model).forward

    def recording(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        calls.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(type(target.model), "forward", recording)
    drafter = EagleDrafter(target, TREES["chain"], str(artifacts["fused"]))
    prompt = PROMPTS[1]
    decode(target, drafter, prompt, n=2)  # the prefill, then one step, which feeds the prompt's rows to the head
    assert calls[0] == 1, f"the prefill projected {calls[0]} rows of a {len(prompt)}-token prompt"
    assert drafter.cache.get_seq_length() == len(prompt)  # a row per prompt position, fed the target's features


def test_fused_features_read_three_layers_and_the_last_reads_one(target, artifacts):
    layers = target.model.config.num_hidden_layers
    fused = EagleDrafter(target, TREES["chain"], str(artifacts["fused"]))
    assert fused.needs_hidden_states == feature_layers(layers, "fused") == (2, 1, 1)  # 3 layers: 2, L//2, L-3 -> 1
    assert fused.head.fuse.in_features == 3 * target.model.config.hidden_size
    assert EagleDrafter(target, TREES["chain"], str(artifacts["last"])).needs_hidden_states == (-1,)
    assert feature_layers(30, "fused") == (2, 15, 27)  # EAGLE-3's layers on SmolLM2-135M


def test_tree_rows_draft_as_their_path_would_alone(target, artifacts):
    """Every node of a dynamic tree sees the committed rows and its ancestors only, at its own position."""
    recording = Recording(DynamicPolicy(budget=16, top_k=3, depth=4))
    drafter = EagleDrafter(target, recording, str(artifacts["fused"]))
    prompt = PROMPTS[1]
    gen = decode(target, drafter, prompt, n=12)  # the tree of the last step grew on a cache of many steps
    committed = prompt + gen.tokens
    c = drafter.cache.get_seq_length()  # one row per committed token before the last tree's root, committed[c]
    paths = [p for p in recording.probs if p]
    assert max(map(len, paths)) == 3
    for path in paths:
        want = reference_chain(drafter.head, target, committed[:c], committed[c], list(path))
        torch.testing.assert_close(recording.probs[path][drafter.d2t], want, atol=1e-5, rtol=1e-4)


def test_draft_cache_holds_the_committed_rows_after_many_rollbacks(target, artifacts):
    drafter = EagleDrafter(target, TREES["dynamic"], str(artifacts["fused"]))
    gen = decode(target, drafter, PROMPTS[1], n=64)
    committed = PROMPTS[1] + gen.tokens
    kept = drafter.cache.get_seq_length()
    assert kept < len(committed) and len({s.accepted for s in gen.steps}) > 1  # rollbacks of several lengths
    head, model = drafter.head, target.model
    fresh = DynamicCache()
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([committed[:kept]]), output_hidden_states=head.layers)
        head(head.fuse(selected_hidden(out, head.layers)),
             model.get_input_embeddings()(torch.tensor([committed[1: kept + 1]])), past_key_values=fresh)
    for ours, ref in zip(drafter.cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys, ref.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, ref.values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", ["fc_first", "eagle3"])
def test_training_time_test_unrolls_as_decoding_drafts(head):
    """Step j at row t is the depth-(j+1) draft after the chain start t - j: the prompt x_0..x_{t-j} with the target's
    features, the root x_{t-j+1}, then x_{t-j+2}..x_{t+1} on the drafter's own features (for either head)."""
    target = lively_tiny(seed=3)
    module = EagleModule(target.model, ttt_steps=3, head=head).eval()
    ids = decode(target, PlainDrafter(), PROMPTS[1], n=12).tokens
    seq = PROMPTS[1] + ids
    ones = torch.ones(1, len(seq), dtype=torch.bool)
    with torch.no_grad():
        steps = list(module.unroll(with_features(module, {"input_ids": torch.tensor([seq]),
                                                          "attention_mask": ones.long(), "loss_mask": ones})))
    assert [j for j, *_ in steps] == [0, 1, 2]
    for j, logits, *_ in steps:
        for t in (j, 5, len(seq) - 3):
            s = t - j
            want = reference_chain(module.head, target, seq[: s + 1], seq[s + 1], seq[s + 2: t + 2])
            torch.testing.assert_close(logits[t - j].softmax(-1), want, atol=1e-5, rtol=1e-4)


def test_ttt_mask_sees_the_target_fed_prefix_and_the_ancestors():
    mask = ttt_mask(4, 2).int()
    # row 3 of step 2: step 0's rows 0..1, step 1's row 2, its own row 3; row 1: only its ancestor row 0 of step 1
    assert mask[3].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert mask[1].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    assert ttt_mask(3, 0).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_tau_sim_is_the_expected_chain_length():
    assert tau_sim([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert tau_sim([1.0, 1.0, 1.0]) == 4.0 and tau_sim([0.0, 1.0]) == 1.0


def test_reduced_vocabulary_maps_back_to_the_target_ids(target, tmp_path):
    d2t = [50, 3, 17, 9, 40, 63, 0, 22]
    drafter = EagleDrafter(target, Recording(ChainPolicy(budget=4)), str(eagle_artifact(tmp_path / "v", target,
                                                                                     d2t=d2t)))
    gen = decode(target, drafter, PROMPTS[0], n=20)
    assert gen.tokens == decode(target, PlainDrafter(), PROMPTS[0], n=20).tokens
    for path, probs in drafter.tree.probs.items():
        assert set(probs.nonzero().flatten().tolist()) == set(d2t) and probs.sum() == pytest.approx(1.0)
        assert set(path) <= set(d2t)  # drafted tokens are target ids of the draft vocabulary
    committed, c = PROMPTS[0] + gen.tokens, drafter.cache.get_seq_length()
    path = max(drafter.tree.probs, key=len)
    want = reference_chain(drafter.head, target, committed[:c], committed[c], list(path))
    torch.testing.assert_close(drafter.tree.probs[path][d2t], want, atol=1e-5, rtol=1e-4)


def test_draft_vocabulary_is_the_most_frequent_response_tokens(tiny, tmp_path):
    data = ShareGPTDataModule(tiny.tokenizer, num_conversations=10, num_val=3, max_length=96)
    data.setup()
    counts = Counter(t for e in data.train_set for t, m in zip(e.input_ids, e.loss_mask) if m)
    module = EagleModule(tiny.model, draft_vocab=12)
    module.trainer = type("T", (), {"datamodule": data})()
    module.setup("fit")
    d2t = module.head.d2t.tolist()
    assert [counts[t] for t in d2t] == sorted(counts.values(), reverse=True)[:12]
    assert module.t2d[d2t].tolist() == list(range(12)) and int((module.t2d >= 0).sum()) == 12
    lm_head = tiny.model.get_output_embeddings().weight
    assert torch.equal(module.head.lm_head.weight, lm_head[d2t])  # the draft head starts as those target rows


# samples through the real decode loop (~16 ms each, against test_rejection.py's precomputed ones): fewer than its
# 3000, and still enough to fail the rule without the residual (test_the_eagle_test_fails_without_the_residual)
EAGLE_SAMPLES = 1000


def eagle_samples(policy: TreePolicy, rule, artifact) -> tuple[float, float]:
    """(TV, bound) of test_rejection.py's test, with the real drafter in the real decode loop."""
    target = rej.lively_tiny(0)
    drafter = EagleDrafter(target, policy, str(artifact), temperature=1.0)
    samples = torch.empty(EAGLE_SAMPLES, rej.TOKENS, dtype=torch.long)
    for i in range(EAGLE_SAMPLES):
        drafter.seed = i  # the draft's own draws, independent of the acceptance's
        gen = decode(target, drafter, rej.PROMPT, rej.TOKENS, rule, rej.SAMPLING, seed=10**6 + i)
        samples[i] = torch.tensor(gen.tokens)
    return rej.tv_and_bound(samples, rej.exact_distribution(rej.logits_table(target.model, rej.TOKENS)))


@pytest.fixture(scope="module")
def sharp_artifact(tmp_path_factory):
    """A draft far from the target, whose q is zero on 3 of the 8 tokens (a reduced vocabulary)."""
    path = tmp_path_factory.mktemp("eagle_rejection") / "r"
    return eagle_artifact(path, rej.lively_tiny(0), d2t=[0, 2, 3, 5, 6], seed=1, sharpness=3.0)


@pytest.mark.parametrize("policy", [ChainPolicy(budget=3), DynamicPolicy(budget=5, top_k=2, depth=2)],
                         ids=["sampled chain", "dynamic tree"])
@pytest.mark.slow
def test_rejection_sampling_with_eagle_keeps_the_target_distribution(sharp_artifact, policy):
    tv, bound = eagle_samples(policy, RejectionSampling(), sharp_artifact)
    assert tv < bound, f"{policy.name}: TV {tv:.4f} exceeds the bound {bound:.4f} for {EAGLE_SAMPLES} samples"


@pytest.mark.slow
def test_the_eagle_test_fails_without_the_residual(sharp_artifact):
    tv, bound = eagle_samples(ChainPolicy(budget=3), rej.RejectionWithoutResidual(), sharp_artifact)
    assert tv > bound, f"the broken rule passed (TV {tv:.4f} <= bound {bound:.4f}): the test has no power"


def test_sampling_draws_children_from_q_and_records_it(target, artifacts):
    drafter = EagleDrafter(target, ChainPolicy(budget=4), str(artifacts["fused"]), temperature=0.8, top_k=20)
    firsts = set()
    for seed in range(8):
        drafter.seed = seed
        gen = decode(target, drafter, PROMPTS[0], n=1)  # the prefill only: reset, then observe the prompt
        tree = drafter.propose(DecodeState(PROMPTS[0] + gen.tokens, len(PROMPTS[0])))
        assert tree.draft_probs is not None and torch.allclose(tree.draft_probs[:-1].sum(-1), torch.ones(3))
        assert int((tree.draft_probs[0] > 0).sum()) == 20  # q after the run's top-k, not the plain softmax
        firsts.add(int(tree.tokens[1]))
    assert len(firsts) > 1, "at temperature > 0 the draft must sample, not take its argmax"


@pytest.mark.slow
def test_train_writes_an_artifact_the_drafter_loads_and_decodes_losslessly(tmp_path, tiny):
    cfg = compose_cfg(["method=eagle", *SMALL, "method.train.max_steps=3", "method.draft_vocab=64"], tmp_path)
    summary = train(cfg, tmp_path)
    meta, tensors = load_artifact(summary["artifact"], "eagle", tiny)
    assert meta["arch"]["draft_vocab"] == 64 and meta["arch"]["feature_layers"] == [2, 1, 1]
    assert tensors["lm_head.weight"].shape == (64, tiny.model.config.hidden_size)
    assert tensors["lm_head.weight"].dtype == torch.bfloat16 and tensors["d2t"].dtype == torch.long
    assert len(meta["metrics"]["rank_accuracy"]) == 3 and meta["metrics"]["val/tau_sim"] >= 1.0
    log = (tmp_path / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert all(k in log for k in ("val/tau_sim", "val/pos3_top1", "train/pos1_top1", "val/vocab_coverage"))
    for tree in (TREES["dynamic"], TREES["chain"], GreedyPolicy(6, accept_prob=None)):
        drafter = EagleDrafter(tiny, tree, summary["artifact"])
        assert drafter.d2t.tolist() == tensors["d2t"].tolist()
        for prompt in PROMPTS:
            assert decode(tiny, drafter, prompt).tokens == decode(tiny, PlainDrafter(), prompt).tokens


@pytest.mark.parametrize("tree", ["dynamic", "chain", "static", "greedy", "hardware_aware"])
def test_eagle_composes_with_every_tree_it_accepts(tree, tmp_path):
    cfg = compose_cfg(["method=eagle", f"tree={tree}"], tmp_path)
    assert instantiate(cfg.tree).name == tree and cfg.method.drafter._target_.endswith("EagleDrafter")


@pytest.mark.parametrize(("kwargs", "message"), [({"draft_vocab": 10**6}, "method.draft_vocab=1000000 is invalid"),
                                                 ({"features": "middle"}, "method.features='middle' is invalid"),
                                                 ({"ttt_steps": 0}, "ttt_steps=0 is invalid"),
                                                 ({"head": "eagle3", "features": "last"}, "method.head='eagle3' is "
                                                  "invalid with method.features giving layers \\[-1\\]"),
                                                 ({"head": "eagle3", "draft_vocab": 10**6}, "method.draft_vocab=1000000")])
def test_bad_knobs_are_refused(tiny, kwargs, message):
    with pytest.raises(SpecbenchError, match=message):
        EagleModule(tiny.model, **kwargs)


def test_an_artifact_of_another_method_is_refused(tiny, tmp_path):
    path = save_artifact(tmp_path / "m", "medusa", tiny, {}, {"x": torch.zeros(1)})
    with pytest.raises(SpecbenchError, match="holds a 'medusa' drafter, not a 'eagle' one"):
        EagleDrafter(tiny, TREES["chain"], str(path))


def test_draft_cost_counts_one_head_forward_per_tree_level(target, artifacts):
    drafter = EagleDrafter(target, TREES["chain"], str(artifacts["fused"]))
    assert drafter.draft_ms([[0]]) > 0 and len(drafter._level_ms) == len(LEVEL_ROWS)  # measured here, once
    drafter._level_ms = [1.0 + 0.01 * n for n in LEVEL_ROWS]  # a known cost per expand of n rows
    root = drafter._expand_ms(ROOT_ROWS)
    assert drafter.draft_ms([[0], [1], [2]]) == pytest.approx(root)  # a star: the root's forward alone
    assert drafter.draft_ms([[0], [0, 0], [0, 0, 0], [1]]) == pytest.approx(root + 2 * 1.01)  # two deeper levels
    assert drafter.draft_ms([[0], [1], [0, 0], [1, 0], [0, 0, 0]]) == pytest.approx(root + 1.02 + 1.01)


def test_hardware_aware_sizes_the_tree_by_the_target_and_the_drafters_own_cost(target, artifacts):
    """With a flat L(n), depth is free for the target, but every level costs the drafter a forward: the tree the
    drafter's cost picks is the best tau per (L + drafting), not the largest."""
    drafter = EagleDrafter(target, HardwareAwarePolicy(budget=24), str(artifacts["fused"]))
    drafter._level_ms = [4.0 for _ in LEVEL_ROWS]  # 4 ms per level, whatever its width
    drafter.fit(lambda n: 10.0)
    table = drafter.tree.accept_prob  # the artifact's held-out rank accuracies
    assert drafter.tree.draft_ms == drafter.draft_ms
    want, rates = best_budget(table, lambda n: 10.0, 24, drafter.draft_ms)
    assert drafter.tree.budget == want and drafter.tree.rates == pytest.approx(rates)
    blind, _ = best_budget(table, lambda n: 10.0, 24)
    assert blind > want  # without the drafter's cost every level looks free
    for prompt in PROMPTS:
        assert decode(target, drafter, prompt).tokens == decode(target, PlainDrafter(), prompt).tokens


@pytest.mark.parametrize("faster", ["eager", "prepacked"])
def test_under_an_eager_run_the_head_drafts_on_whichever_backend_times_faster(faster, target, artifacts, monkeypatch):
    """An eager run (an int4 target's) would leave the head's float linears repacking on every call: on_backend times
    the eager head against a packed one and keeps the faster. The timing is forced here; the drafts do not change."""
    def timed(self, cache, n):
        return 1.0 if isinstance(self.head.fc, PackedLinear) == (faster == "prepacked") else 2.0

    monkeypatch.setattr(EagleDrafter, "_expand_once_ms", timed)
    cfg = OmegaConf.create({"_target_": "specbench.drafters.eagle.EagleDrafter", "checkpoint": str(artifacts["fused"])})
    drafter = build_drafter(cfg, target, DynamicPolicy(budget=11, top_k=3, depth=4), backend="eager")
    assert isinstance(drafter.head.fc, PackedLinear) == (faster == "prepacked")
    assert isinstance(drafter.head.lm_head, PackedLinear) == (faster == "prepacked")
    monkeypatch.undo()
    for prompt in PROMPTS:
        assert decode(target, drafter, prompt).tokens == decode(target, PlainDrafter(), prompt).tokens


def test_the_head_runs_on_the_runs_backend_and_drafts_as_on_eager(target, artifacts):
    """build_drafter hands the head to the run's backend (prepacked: oneDNN-packed linears, not eager GEMMs that
    repack every call); its drafts are the eager head's, so decoding stays lossless with the same accept lengths."""
    cfg = OmegaConf.create({"_target_": "specbench.drafters.eagle.EagleDrafter", "checkpoint": str(artifacts["fused"])})
    packed = build_drafter(cfg, target, DynamicPolicy(budget=11, top_k=3, depth=4), backend="prepacked")
    assert isinstance(packed.head.fc, PackedLinear) and isinstance(packed.head.lm_head, PackedLinear)
    eager = EagleDrafter(target, DynamicPolicy(budget=11, top_k=3, depth=4), str(artifacts["fused"]))
    assert isinstance(eager.head.fc, torch.nn.Linear)
    for prompt in PROMPTS:
        got, want = decode(target, packed, prompt), decode(target, eager, prompt)
        assert got.tokens == want.tokens == decode(target, PlainDrafter(), prompt).tokens
        assert got.accept_lengths == want.accept_lengths


def test_calibration_probes_eagle_and_records_drafted_steps_only(target, artifacts):
    """task=calibrate runs EAGLE as decoding does (its prefill hands the head the prompt's features) and scores the
    drafted steps alone: every step probes each rank at depth 1 once, and the prefill, observed as a step, adds none."""
    from specbench.evaluation.calibration import calibrate, probe_tree

    drafter = EagleDrafter(target, probe_tree(depth=2, ranks=3), str(artifacts["fused"]))
    calibration = calibrate(target.model, drafter, [PROMPTS[0]], depth=2, ranks=3, max_new_tokens=20)
    steps = decode(target, EagleDrafter(target, probe_tree(depth=2, ranks=3), str(artifacts["fused"])), PROMPTS[0],
                   n=20).steps
    assert calibration.trials[0] == [len(steps)] * 3
    assert sum(calibration.hits[0]) > 0
