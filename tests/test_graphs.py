"""The graphs backend's static-cache forward (execution/graphs.py, execution/static_cache.py): on the CPU it runs
uncaptured, the same forward a CUDA graph captures, so its trees, commits and decodes are checked here against
transformers' eager forward on a DynamicCache; the capture itself is checked where CUDA is present."""

import pandas as pd
import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.drafters.sssd import SSSDDrafter
from specbench.errors import SpecbenchError
from specbench.execution.backends import supported, with_backend
from specbench.execution.graphs import BUCKETS, with_graphs
from specbench.execution.static_cache import SlotCache
from specbench.hardware.measured.profiler import latency_profile
from specbench.models.tiny import tiny_config
from specbench.sampling import SamplingParams
from specbench.schema import validate
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.native import NativePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import commit_path, new_cache, verify_tree

from .conftest import compose_cfg, random_medusa_artifact

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs are captured on a CUDA device only")
# a tree of two branches (depth 3), a chain, and a star wider than the first capacity: each call below is one step
TREE = TokenTree(torch.tensor([5, 7, 9, 11, 13]), torch.tensor([-1, 0, 0, 1, 3]))
STAR = TokenTree(torch.tensor([6] * 40), torch.tensor([-1] + [0] * 39))
STEPS = [(TREE, [0, 1, 3]), (TokenTree.chain(13, [4, 6, 8]), [0, 1]), (STAR, [0, 7])]


def steps(model, cache, prompt: torch.Tensor, want_hidden=True) -> list:
    """Prefill, then each of STEPS verified and its path committed: every row's logits and hidden state."""
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True, output_hidden_states=True)
    seen = [(out.logits[0], out.hidden_states[-1][0])]
    for tree, path in STEPS:
        past = cache.get_seq_length()
        v = verify_tree(model, cache, tree, want_hidden)
        seen.append((v.logits, v.hidden))
        commit_path(cache, past, path)
    return seen


def committed(cache) -> list[torch.Tensor]:
    n = cache.get_seq_length()
    return [t[..., :n, :] for layer in cache.layers for t in (layer.keys, layer.values)]


def test_a_tree_verify_on_the_static_cache_gives_every_row_the_eager_forwards_logits_over_steps(tiny):
    """Every row's logits and last hidden state, and the committed keys and values of every layer after each step,
    equal transformers' eager forward on a DynamicCache, over a prefill, a two-branch tree with a non-prefix path
    committed, a chain, and a 40-node star that outgrows the first capacity (the cache reallocates).

    To 1e-5, not bitwise, in float32: a call is padded to its bucket's row count (the GEMMs of 8 rows block their sums
    otherwise than 5) and attention runs over every slot of the cache under a mask rather than over the committed
    keys, so the same products are summed in other orders (seen: up to 3e-6 apart, in logits of magnitude ~10)."""
    prompt = torch.arange(10, 30)[None]
    graphs = with_graphs(tiny.model, capture=False, capacity=32)
    with torch.inference_mode():
        static_cache, eager_cache = new_cache(graphs), DynamicCache(config=tiny.model.config)
        static = steps(graphs, static_cache, prompt)
        eager = steps(tiny.model, eager_cache, prompt)
    assert isinstance(static_cache, SlotCache) and static_cache.capacity == 128  # 25 + a 64-row bucket
    for (logits, hidden), (ref_logits, ref_hidden) in zip(static, eager, strict=True):
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hidden, ref_hidden, rtol=1e-5, atol=1e-5)
    assert static_cache.get_seq_length() == eager_cache.get_seq_length() == 20 + 3 + 2 + 2
    for rows, ref in zip(committed(static_cache), committed(eager_cache), strict=True):
        torch.testing.assert_close(rows, ref, rtol=1e-5, atol=1e-5)


def test_a_commit_moves_the_accepted_rows_by_index_as_the_dynamic_cache_commit_does():
    """Bitwise (a commit only moves rows): the same rows in a SlotCache and a DynamicCache, the same paths committed
    (a branch, a prefix, the root alone), the same committed rows; the blocks are never reallocated."""
    config = tiny_config()
    static, eager = SlotCache(config, capacity=64), DynamicCache(config=config)
    gen = torch.Generator().manual_seed(0)
    length = 0
    for new, path in [(12, list(range(12))), (6, [0, 2, 5]), (5, [0, 1, 2]), (4, [0])]:
        for i in range(config.num_hidden_layers):
            keys, values = (torch.randn(1, 2, new, 16, generator=gen) for _ in range(2))
            static.slots = torch.arange(length, length + new)
            static.update(keys, values, i)
            eager.update(keys, values, i)
        static.length += new
        if new == 12:
            addresses = (static.key_block.data_ptr(), static.value_block.data_ptr())
        commit_path(static, length, path)
        commit_path(eager, length, path)
        length += len(path)
        assert static.get_seq_length() == eager.get_seq_length() == length
        for rows, ref in zip(committed(static), committed(eager), strict=True):
            assert torch.equal(rows, ref)
    assert (static.key_block.data_ptr(), static.value_block.data_ptr()) == addresses


def test_the_padded_rows_of_a_bucket_never_reach_the_real_ones(tiny):
    """Bitwise: a 3-row tree (padded to 4 rows) gives the same logits after 4-row calls at other slots have left their
    tokens, positions, keys and mask rows behind (the padded row then holds another token at another position, and
    the slot after the tree's rows another row's keys), since no real row sees a padded one or a stale slot."""
    graphs = with_graphs(tiny.model, capture=False, capacity=64)
    tree, other = TokenTree(torch.tensor([5, 7, 9]), torch.tensor([-1, 0, 0])), TokenTree.chain(40, [41, 42, 43])
    assert next(b for b in BUCKETS if b >= len(tree)) == len(other)
    with torch.inference_mode():
        cache = new_cache(graphs)
        graphs(input_ids=torch.arange(10, 30)[None], past_key_values=cache, use_cache=True)
        first = verify_tree(graphs, cache, tree).logits
        cache.crop(-len(tree))
        verify_tree(graphs, cache, other)
        commit_path(cache, 20, [0, 1])
        verify_tree(graphs, cache, other)  # at slots 22..25, two past where the tree's rows start
        cache.crop(-len(other) - 2)
        again = verify_tree(graphs, cache, tree).logits
    assert torch.equal(first, again)


def test_the_static_path_keeps_the_last_rows_logits_and_refuses_rows_named_by_a_tensor(tiny):
    """logits_to_keep=k keeps a call's last k rows, as transformers' int form does (the decoder's prefill asks for
    one); a tensor of row indices, transformers' other form, is refused in one line rather than read as a count."""
    graphs = with_graphs(tiny.model, capture=False, capacity=64)
    prompt = torch.arange(10, 30)[None]
    with torch.inference_mode():
        every = graphs(input_ids=prompt, past_key_values=new_cache(graphs), use_cache=True).logits
        last = graphs(input_ids=prompt, past_key_values=new_cache(graphs), use_cache=True, logits_to_keep=1).logits
        with pytest.raises(SpecbenchError, match="logits_to_keep=k"):
            graphs(input_ids=prompt, past_key_values=new_cache(graphs), use_cache=True,
                   logits_to_keep=torch.tensor([3]))
    assert last.shape[1] == 1 and torch.allclose(last[0, 0], every[0, -1], atol=1e-5)


def test_the_captured_forward_reads_no_device_value_on_the_host():
    """A CUDA graph cannot capture a host read of device data (.item(), a data-dependent shape) nor a copy from host
    memory: the static forward, a tree verify and a commit run on the meta device, where each of those raises."""
    with torch.device("meta"):
        model = LlamaForCausalLM(tiny_config()).eval()
    graphs = with_graphs(model, capture=False, capacity=64)
    with torch.inference_mode():
        cache = new_cache(graphs)
        graphs(input_ids=torch.zeros(1, 20, dtype=torch.long, device="meta"), past_key_values=cache, use_cache=True)
        out = verify_tree(graphs, cache, TREE, want_hidden=True)
        commit_path(cache, 20, [0, 2])
    assert out.logits.shape == (len(TREE), model.config.vocab_size) and out.hidden.device.type == "meta"
    assert cache.get_seq_length() == 22
    with pytest.raises(RuntimeError, match="meta"):
        out.logits.sum().item()


def decode(model, tiny, drafter, prompt, max_new=48):
    return Decoder(model, drafter, ExactAcceptance(), SamplingParams(), max_new, tiny.eos_token_ids,
                   max_context=tiny.max_context).generate(prompt)


def test_greedy_pld_sssd_and_medusa_on_the_static_cache_emit_plain_decodings_tokens(tiny, tmp_path):
    """fp32, greedy, exact acceptance: PLD, SSSD (prompt and output n-grams) and Medusa (which reads the verify's
    hidden states) decoded on the static-cache forward emit plain decoding's tokens on the eager model, and so does
    plain decoding on it; the cache starts at 16 slots and grows mid-answer."""
    texts = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]
    prompts = [tiny.tokenizer(t)["input_ids"] for t in texts]
    graphs = with_graphs(tiny.model, capture=False, capacity=16)
    heads = random_medusa_artifact(tmp_path / "m.safetensors", tiny, [[0.5, 0.3], [0.3, 0.2], [0.2, 0.1]])
    drafters = [PromptLookupDrafter(tiny, NativePolicy(11)), SSSDDrafter(tiny, NativePolicy(8), sources=["input"]),
                MedusaDrafter(tiny, GreedyPolicy(8, accept_prob=None), str(heads)), PlainDrafter()]
    accepted = 0
    for prompt in prompts:
        plain = decode(tiny.model, tiny, PlainDrafter(), prompt)
        for drafter in drafters:
            out = decode(graphs, tiny, drafter, prompt)
            assert out.tokens == plain.tokens, type(drafter).__name__
            accepted += sum(s.accepted for s in out.steps)
    assert accepted > 0  # drafts were accepted, so paths were committed, not only roots
    assert graphs.forward.cache.capacity > 16


def test_any_other_cache_runs_the_models_own_forward(tiny):
    """A drafter's own DynamicCache (a draft model under the run's backend) or no cache: the module's eager forward,
    untouched; only the cache new_cache hands out runs the static path."""
    graphs = with_graphs(tiny.model, capture=False)
    ids = torch.arange(10, 20)[None]
    with torch.inference_mode():
        ref = tiny.model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True).logits
        assert torch.equal(graphs(input_ids=ids, past_key_values=DynamicCache(), use_cache=True).logits, ref)
        assert torch.equal(graphs(input_ids=ids).logits, tiny.model(input_ids=ids).logits)
    assert isinstance(new_cache(tiny.model), DynamicCache) and isinstance(new_cache(graphs), SlotCache)


def test_the_machine_profile_times_the_static_path(tiny):
    """latency_profile (what the machine profile runs per execution) verifies on the execution's own cache and leaves
    it at its context."""
    graphs = with_graphs(tiny.model, capture=False, capacity=64)
    frame = latency_profile(graphs, sizes=(1, 4), context=32, repeats=1)
    assert frame["tokens"].tolist() == [1, 4] and (frame["ms"] > 0).all()
    assert graphs.forward.cache.get_seq_length() == 32


def test_a_run_on_the_graphs_backend_decodes_through_plan_and_summary_losslessly(tmp_path, monkeypatch):
    """python run.py model.backend=graphs as experiment=gpu/graphs runs it (its own plain decoding the reference,
    eager's beside it), on the tiny model with the backend let onto the CPU, where it runs uncaptured: the plan builds
    the target on it, every prompt decodes, the run's L(n) is measured on its static cache, and PLD's tokens are its
    plain decoding's and the eager plain decoding's (fp32)."""
    from specbench import schema
    from specbench.execution import graphs
    from specbench.tasks import eval as eval_task

    monkeypatch.setattr(graphs, "unsupported", lambda device: None)
    monkeypatch.setattr(schema, "check_run", lambda backend, device, batch_size: None)
    overrides = ["model=tiny_random", "model.backend=graphs", "eval.dtype=float32", "methods=[pld]",
                 "eval.plain_executions=[eager/float32]", "eval.fastest_plain=false", "eval.num_prompts=3",
                 "eval.max_new_tokens=24", "eval.profile_sizes=[1,2,4]", "eval.profile_repeats=1",
                 "eval.memory_probe=false"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path)).set_index("method")
    assert summary.loc["plain", "backend"] == summary.loc["pld", "backend"] == "graphs"
    assert (summary["backend"] == "eager").sum() == 1 and (summary["num_prompts"] == 3).all()
    assert (summary["lossless_match"] == 1.0).all()
    profile = pd.read_csv(tmp_path / "latency_profile.csv")
    assert profile["tokens"].tolist() == [1, 2, 4]
    records = pd.read_json(tmp_path / "records.jsonl", lines=True)
    eager = records[records["backend"] == "eager"].set_index("question_id")["output_ids"]
    pld = records[records["method"] == "pld"].set_index("question_id")["output_ids"]
    assert all(eager[q] == pld[q] for q in pld.index)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the backend runs here")
def test_without_cuda_the_graphs_backend_is_refused_in_one_line(tiny, tmp_path):
    """Where the user asks for it: model.backend=graphs on hw=cpu (or with batched decoding) is one error line before
    anything loads, and applied to a CPU model (eval.plain_executions, a profile) it says why it cannot run."""
    with pytest.raises(SpecbenchError, match=r"model.backend=graphs replays CUDA graphs, so it needs a CUDA device"):
        validate(compose_cfg(["model=tiny_random", "model.backend=graphs"], tmp_path))
    with pytest.raises(SpecbenchError, match=r"eval.batch_size=2 is invalid with it: use eval.batch_size=1"):
        validate(compose_cfg(["model=tiny_random", "model.backend=graphs", "hw=cuda", "eval.batch_size=2"], tmp_path))
    assert "CUDA device" in supported("graphs", torch.float32, torch.device("cpu"))
    with pytest.raises(SpecbenchError, match="model.backend=graphs cannot run"):
        with_backend(tiny, "graphs")


@CUDA
def test_captured_graphs_replay_the_uncaptured_forward_bitwise_on_cuda():
    """The same kernels replayed: every row's logits and hidden states, and the committed cache, equal the uncaptured
    static forward's bitwise over the steps above; every bucket captured once, at the first call."""
    model = LlamaForCausalLM(tiny_config()).cuda().eval()
    prompt = torch.arange(10, 30, device="cuda")[None]
    captured, plain = with_graphs(model, capture=True, capacity=128), with_graphs(model, capture=False, capacity=128)
    with torch.inference_mode():
        runs = [(steps(g, new_cache(g), prompt), committed(g.forward.cache)) for g in (captured, plain)]
        for _ in range(2):  # replays: no new capture
            steps(captured, new_cache(captured), prompt)
    for (a, b) in zip(runs[0][0] + [tuple(runs[0][1])], runs[1][0] + [tuple(runs[1][1])], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert captured.compile_stats.graphs == len(captured.forward.graphs) == len(BUCKETS)  # the ladder, once


@CUDA
def test_greedy_pld_on_captured_graphs_emits_plain_decodings_tokens_on_cuda(tiny):
    """fp32 on the GPU: PLD on the captured forward emits the captured plain decoding's tokens."""
    model = tiny.model.to("cpu")
    gpu = LlamaForCausalLM(model.config).cuda().eval()
    gpu.load_state_dict(model.state_dict())
    graphs = with_graphs(gpu)
    prompt = tiny.tokenizer("the cat sat on the mat and the cat sat on the hat")["input_ids"]
    plain = decode(graphs, tiny, PlainDrafter(), prompt)
    out = decode(graphs, tiny, PromptLookupDrafter(tiny, NativePolicy(11)), prompt)
    assert out.tokens == plain.tokens and sum(s.accepted for s in out.steps) > 0
