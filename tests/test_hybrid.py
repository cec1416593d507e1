"""The hybrid drafter: rates and merge by hand, greedy output equal to plain decoding (token-only sources, EAGLE's
head, batched), a replay that takes the decoding's steps, the rejection sampler's distribution kept, bad input."""

import pytest
import torch

from specbench.acceptance import ExactAcceptance
from specbench.acceptance.rejection import RejectionSampling
from specbench.batching import BatchDecoder
from specbench.data.datastore import Datastore
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.base import DecodeState, Drafter
from specbench.drafters.hybrid import AcceptanceRates, HybridDrafter, TokenHybridDrafter, Union
from specbench.errors import SpecbenchError
from specbench.evaluation.replay import replay
from specbench.sampling import SamplingParams
from specbench.trees.native import NativePolicy
from specbench.trees.token_tree import TokenTree

from . import test_rejection as rej
from .test_sssd import FLAT, STEEP, sized_tree_sizes

TEXTS = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "x", "hello world " * 6]
SSSD = "specbench.drafters.sssd.SSSDDrafter"
PLD = {"drafter": {"_target_": "specbench.drafters.pld.PromptLookupDrafter"}}
SUFFIX = {"drafter": {"_target_": "specbench.drafters.suffix.SuffixDrafter", "suffix_tree": "python"}}


def decode(model, drafter, prompt, max_new=48, eos=(), acceptance=None, sampling=None, seed=0):
    return Decoder(model.model, drafter, acceptance or ExactAcceptance(), sampling or SamplingParams(), max_new,
                   list(eos), seed=seed, max_context=model.max_context).generate(prompt)


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def store(tiny, prompts, tmp_path_factory):
    """A datastore of the tiny model's own continuations of the first two prompts: SSSD's drafts match there."""
    docs = [p + decode(tiny, PlainDrafter(), p).tokens for p in prompts[:2]]
    path = tmp_path_factory.mktemp("ds") / "tiny.npz"
    Datastore.build(docs, tiny.tokenizer, tiny.name).save(path)
    return str(path)


def sssd(store):
    return {"drafter": {"_target_": SSSD, "datastore": store}}


class Fixed(Drafter):
    """A drafter that proposes the same tree after any root (its tokens and parents given)."""

    drafts_from_tokens = True

    def __init__(self, target, tree, tokens: list[int], parents: list[int]) -> None:
        self.tokens, self.parents = tokens, parents

    def propose(self, state):
        return TokenTree([state.root, *self.tokens], [-1, *(p + 1 for p in self.parents)])


def fixed(tokens, parents):
    return {"drafter": {"_target_": f"{__name__}.Fixed", "tokens": tokens, "parents": parents}}


A, B, BOTH = 0b01, 0b10, 0b11  # proposers: the first source, the second, both
TREE_A = ([5, 7, 9], [-1, 0, 1])  # a chain 5 -> 7 -> 9
TREE_B = ([5, 6, 8], [-1, -1, 0])  # 5 | 6 at the root, 8 under 5


def test_the_union_merges_equal_tokens_under_one_parent_and_keeps_who_proposed_each_at_what_rank():
    union = Union(3, [TokenTree([3, *TREE_A[0]], [-1, *(p + 1 for p in TREE_A[1])]),
                      TokenTree([3, *TREE_B[0]], [-1, *(p + 1 for p in TREE_B[1])])])
    assert union.tokens == [3, 5, 7, 9, 6, 8] and union.parents == [-1, 0, 1, 2, 0, 1]
    assert union.proposers == [0, BOTH, A, A, B, B] and union.ranks == [0, 0, 0, 0, 1, 0]
    assert union.depths == [0, 1, 2, 3, 1, 2] and union.children == [[1, 4], [2, 5], [3], [], [], []]


def test_rates_learn_what_the_emitted_tokens_accept_by_proposers_depth_and_rank():
    """Emitted 5 8 4 on the union above: at depth 1 both-proposed 5 (rank 0) and B's 6 (rank 1) were offered and 5
    accepted; at depth 2 A's 7 and B's 8 were offered and 8 accepted; 8 has no children, so nothing deeper."""
    union = Union(3, [TokenTree([3, *TREE_A[0]], [-1, *(p + 1 for p in TREE_A[1])]),
                      TokenTree([3, *TREE_B[0]], [-1, *(p + 1 for p in TREE_B[1])])])
    rates = AcceptanceRates(2, depths=3, ranks=2, prior=0.5, prior_weight=2.0, decay=1.0)
    rates.learn(union, [5, 8, 4])
    offered = {tuple(int(i) for i in c): v for c, v in zip(zip(*rates.offered.nonzero()), rates.offered[rates.offered > 0])}
    accepted = {tuple(int(i) for i in c): v for c, v in zip(zip(*rates.accepted.nonzero()),
                                                            rates.accepted[rates.accepted > 0])}
    assert offered == {(BOTH, 0, 0): 1, (B, 0, 1): 1, (A, 1, 0): 1, (B, 1, 0): 1}
    assert accepted == {(BOTH, 0, 0): 1, (B, 1, 0): 1}
    assert rates.rate(BOTH, 1, 0) == pytest.approx((1 + 1) / (1 + 2)) and rates.rate(A, 2, 0) == pytest.approx(1 / 3)
    assert rates.rate(A, 3, 0) == 0.5  # nothing seen: the prior
    assert rates.rate(B, 9, 5) == rates.rate(B, 3, 1)  # deeper and later siblings share the last cell
    halving = AcceptanceRates(2, depths=3, ranks=2, prior=0.5, prior_weight=2.0, decay=0.5)
    halving.learn(union, [5, 8, 4])
    halving.learn(union, [4])  # none of the root's children
    assert halving.offered[BOTH, 0, 0] == 1.5 and halving.accepted[BOTH, 0, 0] == 0.5


def held(rates: AcceptanceRates, proposers: int, rate: float) -> None:
    """Counts so many that the prior vanishes: `rate` for these proposers at every depth and rank."""
    rates.offered[proposers] = 1e9
    rates.accepted[proposers] = 1e9 * rate


def test_the_tree_is_the_unions_best_nodes_grown_best_first(tiny):
    """With rates 0.9 for both sources' nodes, 0.8 for A's alone and 0.3 for B's alone: 5 (0.9), 7 (0.72), 9
    (0.576), then B's 6 (0.3) above B's 8 under 5 (0.9 * 0.3 = 0.27)."""
    def hybrid(budget):
        out = HybridDrafter(tiny, NativePolicy(budget), {"a": fixed(*TREE_A), "b": fixed(*TREE_B)})
        for proposers, rate in ((BOTH, 0.9), (A, 0.8), (B, 0.3)):
            held(out.rates, proposers, rate)
        return out

    tree = hybrid(4).propose(DecodeState(tokens=[1, 2, 3], prompt_len=2))
    assert tree.tokens.tolist() == [3, 5, 7, 9] and tree.parents.tolist() == [-1, 0, 1, 2]
    tree = hybrid(6).propose(DecodeState(tokens=[1, 2, 3], prompt_len=2))
    assert tree.tokens.tolist() == [3, 5, 7, 9, 6, 8] and tree.parents.tolist() == [-1, 0, 1, 2, 0, 1]
    other = hybrid(3)
    held(other.rates, B, 0.85)  # B alone now beats A alone: 6 (0.85) before 7 (0.72)
    tree = other.propose(DecodeState(tokens=[1, 2, 3], prompt_len=2))
    assert tree.tokens.tolist() == [3, 5, 6] and tree.parents.tolist() == [-1, 0, 0]


@pytest.mark.parametrize("cls, second", [(TokenHybridDrafter, PLD), (TokenHybridDrafter, SUFFIX)],
                         ids=["sssd+pld", "sssd+suffix"])
@pytest.mark.parametrize("budget", [2, 4, 8])
def test_greedy_output_equals_plain_decoding(tiny, prompts, store, cls, second, budget):
    hybrid = cls(tiny, NativePolicy(budget), {"sssd": sssd(store), "other": second})
    accepted = 0
    for prompt in prompts:
        want = decode(tiny, PlainDrafter(), prompt).tokens
        got = decode(tiny, hybrid, prompt)
        assert got.tokens == want
        assert max(s.tree_size for s in got.steps) <= budget
        accepted += sum(s.accepted for s in got.steps)
    assert accepted > 0
    assert hybrid.rates.offered[A].sum() > 0 and hybrid.rates.offered[B:].sum() > 0  # both sources' nodes offered


def test_a_sized_merged_tree_is_lossless_and_keeps_the_nodes_that_pay(tiny, prompts, store):
    """Sized, the merged tree is the best-first prefix that pays most on L(n): all of it on a flat L(n), fewer
    nodes where each row costs 0.6 of a step, and the same tokens as plain decoding either way."""
    def make(**sized):
        return TokenHybridDrafter(tiny, NativePolicy(8), {"sssd": sssd(store), "other": SUFFIX}, **sized)

    unsized = [s.tree_size for p in prompts for s in decode(tiny, make(), p).steps]
    flat, _ = sized_tree_sizes(tiny, make, prompts, FLAT, decode)
    steep, _ = sized_tree_sizes(tiny, make, prompts, STEEP, decode)
    assert sum(flat) == pytest.approx(sum(unsized), rel=0.2) and max(flat) == 8
    assert sum(steep) / len(steep) < sum(flat) / len(flat)


def test_a_replay_of_the_plain_answers_takes_the_decodings_steps(tiny, prompts, store):
    """The rates learn from the emitted tokens, so a replay without the target drafts the trees the decoding drafted:
    the same steps, prompt after prompt, as the rates carry over."""
    def hybrid():
        return TokenHybridDrafter(tiny, NativePolicy(4), {"sssd": sssd(store), "suffix": SUFFIX})

    decoding, replaying = hybrid(), hybrid()
    for prompt in prompts:
        got = decode(tiny, decoding, prompt)
        answer = decode(tiny, PlainDrafter(), prompt).tokens
        replayed = replay(replaying, prompt, answer).accept_lengths
        # the last step: the decoder counts what it accepted, the replay what the answer's end kept
        assert replayed[:-1] == got.accept_lengths[:-1] and len(replayed) == len(got.accept_lengths)
    assert (decoding.rates.table() == replaying.rates.table()).all()


def test_batched_decoding_forks_the_sources_and_equals_the_single_decoder(tiny, prompts, store):
    hybrid = TokenHybridDrafter(tiny, NativePolicy(4), {"sssd": sssd(store), "suffix": SUFFIX})
    batch = BatchDecoder(tiny.model, hybrid, ExactAcceptance(), SamplingParams(), 24).generate_batch(prompts[:2])
    for prompt, got in zip(prompts[:2], batch):
        assert got.tokens == decode(tiny, PlainDrafter(), prompt, max_new=24).tokens
    assert hybrid.rates.offered.sum() > 0  # the forks' steps teach the rates they share


def eagle_entry(artifact) -> dict:
    return {"drafter": {"_target_": "specbench.drafters.eagle.EagleDrafter", "checkpoint": str(artifact)},
            "tree": {"_target_": "specbench.trees.dynamic.DynamicPolicy", "budget": 6, "top_k": 2, "depth": 3}}


def lossless_with_eagle(artifact_of) -> HybridDrafter:
    """A PLD + EAGLE hybrid decodes test_eagle.py's prompts as plain decoding does; the hybrid, for more checks."""
    from .test_draft_model import lively_tiny
    from .test_eagle import PROMPTS

    target = lively_tiny()
    hybrid = HybridDrafter(target, NativePolicy(6), {"pld": PLD, "eagle": eagle_entry(artifact_of(target))})
    for prompt in PROMPTS:
        want = decode(target, PlainDrafter(), prompt, max_new=36).tokens
        assert decode(target, hybrid, prompt, max_new=36).tokens == want
    return hybrid


def test_a_hybrid_with_eagles_head_is_lossless_and_passes_the_heads_hooks_on(tmp_path):
    from .test_eagle import eagle_artifact

    hybrid = lossless_with_eagle(lambda target: eagle_artifact(tmp_path / "eagle", target))
    eagle = hybrid.sources["eagle"]
    assert hybrid.needs_hidden_states == eagle.needs_hidden_states and hybrid.needs_hidden_states
    assert hybrid.parameters_bytes() == eagle.parameters_bytes() and hybrid.cache_bytes() == eagle.cache_bytes()
    assert hybrid.rates.offered[B:].sum() > 0  # the head's nodes (the second source) were offered
    entry = eagle_entry(tmp_path / "eagle")
    with pytest.raises(SpecbenchError, match=r"method.drafter.drafters.eagle \(EagleDrafter\) drafts from the "
                                             r"target's outputs, which TokenHybridDrafter"):
        TokenHybridDrafter(None, NativePolicy(6), {"pld": PLD, "eagle": entry})
    with pytest.raises(SpecbenchError, match=r"method.drafter.drafters \['a', 'b'\] both draft from the target's "
                                             r"outputs; at most one may"):
        HybridDrafter(None, NativePolicy(6), {"a": entry, "b": entry})


def test_a_trained_heads_nodes_are_accepted_inside_the_merged_tree(tmp_path):
    """The head re-feeds the merged tree's accepted path (its observe), so its drafts keep being accepted."""
    from .test_eagle import fitted_artifact

    hybrid = lossless_with_eagle(lambda target: fitted_artifact(tmp_path / "eagle", target, "fused", steps=30))
    eagle = hybrid.rates.accepted[B:]  # nodes the head proposed, alone or with PLD
    assert eagle[:, 0].sum() > 0 and eagle[:, 1].sum() > 0  # at depth 1 and below it


class TableSource(Drafter):
    """test_rejection.py's noisy draft model read from its table, sampling its children with its own generator."""

    tree_policies = ("dynamic",)
    tables: dict = {}

    def __init__(self, target, tree, seed: int = 7) -> None:
        self.tree, self.table = tree, self.tables["draft"]
        self.generator = torch.Generator().manual_seed(seed)

    def expand(self, tree, nodes):
        return torch.stack([rej.SAMPLING.probs(self.table[self.context + tuple(tree.path_tokens(n))]) for n in nodes])

    def propose(self, state):
        self.context = tuple(state.tokens[len(rej.PROMPT):])
        return self.tree.build(state.root, self)


def hybrid_samples(target_table, rule, n: int) -> torch.Tensor:
    """n draws of the first TOKENS tokens, every step a tree merged from the sampled table draft and PLD."""
    source = {"drafter": {"_target_": f"{__name__}.TableSource"},
              "tree": {"_target_": "specbench.trees.dynamic.DynamicPolicy", "budget": 3, "top_k": 2, "depth": 2}}
    hybrid = HybridDrafter(None, NativePolicy(3), {"table": source, "pld": PLD})
    gen = torch.Generator().manual_seed(1234)
    out = torch.empty(n, rej.TOKENS, dtype=torch.long)
    for i in range(n):
        state = DecodeState(tokens=rej.PROMPT + [rej.SAMPLING.sample(target_table[()], gen)],
                            prompt_len=len(rej.PROMPT))
        hybrid.reset(state)
        while len(state.tokens) - len(rej.PROMPT) < rej.TOKENS:
            tree = hybrid.propose(state)
            assert tree.draft_probs is None and len(tree) <= 3
            done = tuple(state.tokens[len(rej.PROMPT):])
            logits = torch.stack([target_table[done + tuple(tree.tokens[tree.path_to(node)[1:]].tolist())]
                                  for node in range(len(tree))])
            acc = rule.accept(tree, logits, rej.SAMPLING, gen)
            state.tokens += tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
        out[i] = torch.tensor(state.tokens[len(rej.PROMPT):][: rej.TOKENS])
    return out


# fewer than test_rejection.py's 3000 (a merged step costs more than a table lookup), still enough to fail the rule
# without the residual (the second test)
HYBRID_SAMPLES = 2000


@pytest.fixture(scope="module")
def target_table():
    target = rej.lively_tiny(0)
    TableSource.tables["draft"] = rej.logits_table(rej.noisy_copy(target, 1.5).model, rej.TOKENS + 1)
    return rej.logits_table(target.model, rej.TOKENS + 1)


def test_rejection_sampling_of_the_merged_tree_keeps_the_target_distribution(target_table):
    """test_rejection.py's test on trees merged from a sampled draft (whose q the merge drops) and PLD's deterministic
    copies: the first three tokens follow the target's distribution."""
    samples = hybrid_samples(target_table, RejectionSampling(), HYBRID_SAMPLES)
    tv, bound = rej.tv_and_bound(samples, rej.exact_distribution(target_table))
    assert tv < bound, f"TV {tv:.4f} exceeds the bound {bound:.4f} for {HYBRID_SAMPLES} samples"


def test_the_merged_tree_test_fails_without_the_residual(target_table):
    samples = hybrid_samples(target_table, rej.RejectionWithoutResidual(), HYBRID_SAMPLES)
    tv, bound = rej.tv_and_bound(samples, rej.exact_distribution(target_table))
    assert tv > bound, f"the broken rule passed (TV {tv:.4f} <= bound {bound:.4f}): the test has no power"


@pytest.mark.parametrize("kwargs, message", [
    (dict(drafters={"only": PLD}), "method.drafter.drafters=.* is invalid: give two or more entries"),
    (dict(drafters={"a": PLD, "b": {"drafter": {}}}), "method.drafter.drafters=.* is invalid: give two or more entries"),
    (dict(drafters={"a": PLD, "b": {**PLD, "extra": 1}}), "method.drafter.drafters=.* is invalid: give two or more entries"),
    (dict(drafters={"a": PLD, "b": PLD}, ranks=0), "method.drafter.ranks=0 is invalid: it must be an integer >= 1"),
    (dict(drafters={"a": PLD, "b": PLD}, decay=0.0), r"method.drafter.decay=0.0 is invalid: it must be a number in \(0, 1\]"),
    (dict(drafters={"a": PLD, "b": PLD}, prior=1.5), r"method.drafter.prior=1.5 is invalid: it must be a number in \[0, 1\]"),
    (dict(drafters={"a": PLD, "b": PLD}, prior_weight=0), "method.drafter.prior_weight=0 is invalid"),
    (dict(drafters={"a": PLD, "b": PLD}, sized="yes"), "method.drafter.sized='yes' is invalid: it must be true or false"),
    (dict(drafters={"a": PLD, "b": {"drafter": {"_target_": "specbench.drafters.eagle.EagleDrafter"},
                                    "tree": {"_target_": "specbench.trees.native.NativePolicy", "budget": 4}}}),
     r"method.drafter.drafters.b \(EagleDrafter\) drafts from the target's outputs"),
])
def test_bad_settings_are_one_line(tiny, kwargs, message):
    with pytest.raises(SpecbenchError, match=message):
        TokenHybridDrafter(tiny, NativePolicy(4), **kwargs)


def test_a_source_given_a_tree_it_does_not_take_or_adding_verify_rows_is_named_before_anything_loads(tiny):
    dynamic = {"_target_": "specbench.trees.dynamic.DynamicPolicy", "budget": 4, "top_k": 2, "depth": 2}
    with pytest.raises(SpecbenchError, match=r"method.drafter.drafters.b \(PromptLookupDrafter\) takes tree=native, not "
                                             r"dynamic"):
        TokenHybridDrafter(tiny, NativePolicy(4), {"a": PLD, "b": {**PLD, "tree": dynamic}})
    with pytest.raises(SpecbenchError, match=r"method.drafter.max_depth=1 is invalid"):  # a source's own knob
        TokenHybridDrafter(tiny, NativePolicy(4), {"a": PLD, "b": {"drafter": {**SUFFIX["drafter"], "max_depth": 1}}})
    ppd = {"drafter": {"_target_": "specbench.drafters.ppd.PPDDrafter", "checkpoint": "/nowhere"}}
    with pytest.raises(SpecbenchError, match=r"method.drafter.drafters.b \(PPDDrafter\) adds rows of its own to the verify"):
        HybridDrafter(tiny, NativePolicy(4), {"a": PLD, "b": ppd})


def test_forget_sets_the_rates_back_to_the_prior_and_the_sources_as_built(tiny, prompts, store):
    hybrid = TokenHybridDrafter(tiny, NativePolicy(4), {"sssd": sssd(store), "suffix": SUFFIX})
    decode(tiny, hybrid, prompts[0])
    assert hybrid.rates.offered.sum() > 0 and hybrid.sources["suffix"].global_tree.num_seqs() == 1
    hybrid.forget()
    assert hybrid.rates.offered.sum() == 0 and (hybrid.rates.table() == 0.5).all()
    assert hybrid.sources["suffix"].global_tree.num_seqs() == 0


def test_a_run_of_the_hybrid_is_replayed_step_for_step(store, tmp_path):
    """An evaluation (its untimed warm-up and memory probe included) and task=replay on its answers: the same tau, as
    the evaluator has the hybrid forget the untimed generations."""
    from specbench.tasks import eval as eval_task
    from specbench.tasks import dispatch

    from .conftest import compose_cfg

    run = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=3", "eval.max_new_tokens=40",
           "eval.memory_probe=true", "eval.fastest_plain=false", "eval.latency_profile=false", f"datastore.path={store}"]
    summary = eval_task.run(compose_cfg([*run, "method=hybrid"], tmp_path / "run"))
    replayed = dispatch(compose_cfg(["task=replay", "model=tiny_random", "method=hybrid", f"datastore.path={store}",
                                     f"replay.run={tmp_path / 'run'}"], tmp_path / "replay"))
    recorded = summary.set_index("method").loc["hybrid", "tau"]
    assert recorded > 1.0 and replayed["tau"].item() == pytest.approx(recorded, rel=1e-12)
