"""Execution backends run the same model: tree verification matches one-token forwards on every backend, greedy
speculative decoding equals plain decoding on it, and its output equals the eager backend's in fp32."""

import copy
import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.errors import SpecbenchError
from specbench.execution.backends import PackedLinear, supported, with_backend
from specbench.models.loading import with_dtype
from specbench.execution.quantize import with_weights
from specbench.sampling import SamplingParams
from specbench.trees.native import NativePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import commit_path, verify_tree

NO_OPENVINO = importlib.util.find_spec("openvino") is None or importlib.util.find_spec("nncf") is None
OPENVINO = pytest.param("openvino", marks=pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed"))
NO_ONNXRUNTIME = any(importlib.util.find_spec(m) is None for m in ("onnxruntime", "onnxruntime_genai", "onnx_ir"))
ONNXRUNTIME = pytest.param("onnxruntime", marks=pytest.mark.skipif(NO_ONNXRUNTIME, reason="onnxruntime-genai is not "
                                                                                          "installed"))
FAST = ["prepacked", "compile", OPENVINO, ONNXRUNTIME]


@pytest.fixture(scope="module")
def fast(tiny):
    """Each backend built when a test first asks for it (openvino exports an IR, which needs the package)."""
    class Backends(dict):
        def __missing__(self, name):
            self[name] = with_backend(tiny, name)
            return self[name]

    return Backends()


def test_prepacked_swaps_every_linear_on_a_copy_and_keeps_the_weights_shared(tiny, fast):
    """q/k/v and gate/up are one packed GEMM each (execution/linears.py), every other linear packed alone."""
    packed = fast["prepacked"].model
    linears = [n for n, m in tiny.model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    for name in linears:
        layer = packed.get_submodule(name)
        fused = name.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
        assert isinstance(layer.fused.linear if fused else layer, PackedLinear), name
    attn = packed.model.layers[0].self_attn
    assert attn.q_proj.fused is attn.k_proj.fused is attn.v_proj.fused  # one GEMM for the three
    assert all(isinstance(tiny.model.get_submodule(n), torch.nn.Linear) for n in linears)  # the original is intact
    assert packed.lm_head.weight is tiny.model.lm_head.weight  # tied and shared: nothing copied but the packing
    assert fast["prepacked"].backend == "prepacked" and tiny.backend == "eager"


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.slow
def test_a_tree_forward_on_the_backend_equals_one_token_forwards_on_the_eager_model(tiny, fast, backend):
    """The tree mask and the path gather into the cache work on the backend: each node's logits equal those of
    eager one-token forwards along its path."""
    model, prompt = fast[backend].model, torch.arange(10, 30)[None]
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13]), torch.tensor([-1, 0, 0, 1, 3]))  # two branches, depth 3
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        logits = verify_tree(model, cache, tree).logits
        commit_path(cache, prompt.shape[1], [0, 1, 3])  # keep the branch 5 -> 7 -> 11
        after = verify_tree(model, cache, TokenTree(torch.tensor([13]), torch.tensor([-1]))).logits
        for node in range(len(tree)):
            path = tree.tokens[tree.path_to(node)]
            ref = tiny.model(input_ids=torch.cat([prompt[0], path])[None]).logits[0, -1]
            assert torch.allclose(logits[node], ref, atol=1e-4), node
        ref = tiny.model(input_ids=torch.cat([prompt[0], torch.tensor([5, 7, 11, 13])])[None]).logits[0, -1]
        assert torch.allclose(after[0], ref, atol=1e-4)


def test_the_exported_attention_over_the_cache_and_the_new_rows_apart_equals_transformers_sdpa():
    """split_attention (what the openvino export traces, so the cache is never copied) gives transformers' SDPA output
    for grouped-query heads under a tree mask with cached keys, fully masked padding keys and a padding row included."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specbench.execution.openvino import split_attention

    torch.manual_seed(0)
    heads, kv_heads, dim, past, n, layer = 6, 2, 8, 7, 4, 1
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups, module.is_causal = layer, heads // kv_heads, True
    query = torch.randn(1, heads, n, dim)
    key, value = torch.randn(1, kv_heads, n, dim), torch.randn(1, kv_heads, n, dim)
    cached = [torch.randn(1, kv_heads, past, dim) for _ in range(4)]  # two layers' keys and values
    tree = TokenTree(torch.tensor([5, 7, 9, 11]), torch.tensor([-1, 0, 0, 1]))
    mask = torch.cat([torch.ones(n, past, dtype=torch.bool), tree.ancestor_mask()], 1)
    mask[:, past - 2:past] = False  # two padding keys, as a static shape's cache holds them
    mask[3] = False  # a padding row sees only itself
    mask[3, past + 3] = True
    mask = mask[None, None]
    got, _ = split_attention(module, query, key, value, mask, scaling=dim ** -0.5, cached_kv=cached)
    full_k, full_v = (torch.cat([cached[2 * layer + i], new], 2) for i, new in enumerate((key, value)))
    want, _ = sdpa_attention_forward(module, query, full_k, full_v, mask, scaling=dim ** -0.5)
    assert got.shape == want.shape == (1, n, heads, dim)
    assert torch.allclose(got, want, atol=1e-5)
    other, _ = split_attention(module, query, key, value, mask, scaling=dim ** -0.5, cached_kv=cached[::-1])
    assert not torch.allclose(other, want, atol=1e-3)  # it reads its own layer's cache


def test_the_row_invariant_attention_equals_sdpa_and_computes_a_row_alike_whether_its_ancestors_are_cached_or_new():
    """recent_attention (w4a8r's export) gives transformers' SDPA output under a tree mask, and a row's output is
    bitwise the same when its ancestors' keys are new rows of the call (a tree verify) and when they are cached (plain
    decoding): the float sums run in an order fixed by the row's position, so int8 activations downstream see the same
    numbers. split_attention, which puts new rows in a block of their own, fails the second check."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specbench.execution.openvino import RECENT_DEPTH, recent_attention, split_attention, window_inputs

    torch.manual_seed(0)
    heads, kv_heads, dim, past, layer = 6, 2, 8, 40, 0
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups, module.is_causal = layer, heads // kv_heads, True
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13]), torch.tensor([-1, 0, 0, 1, 3]))  # node 4 at depth 3
    n = len(tree)
    query = torch.randn(1, heads, n, dim)
    key, value = torch.randn(1, kv_heads, n, dim), torch.randn(1, kv_heads, n, dim)
    cached = [torch.randn(1, kv_heads, past, dim) for _ in range(2)]
    mask = torch.cat([torch.ones(n, past, dtype=torch.bool), tree.ancestor_mask()], 1)[None, None]
    positions = past + tree.depths[None]
    padded = 64  # a static shape's cache: slots past its rows hold stale keys, which must not count
    stale = [torch.cat([c, torch.randn(1, kv_heads, padded - past, dim)], 2) for c in cached]
    cached_mask, *window = window_inputs(mask, positions, past, padded)
    got, _ = recent_attention(module, query, key, value, cached_mask, scaling=dim ** -0.5, cached_kv=stale,
                              recent=tuple(window))
    full_k, full_v = (torch.cat([cached[i], new], 2) for i, new in enumerate((key, value)))
    want, _ = sdpa_attention_forward(module, query, full_k, full_v, mask, scaling=dim ** -0.5)
    assert torch.allclose(got, want, atol=1e-5)

    def alone(attention, node):  # node's row as plain decoding computes it: its ancestors cached, itself new
        path = tree.path_to(node)[:-1]
        cache = [torch.cat([c, new[:, :, path]], 2) for c, new in zip(cached, (key, value))]
        depth = len(path)
        row_mask = torch.ones(1, 1, 1, past + depth + 1, dtype=torch.bool)
        args = (module, query[:, :, node:node + 1], key[:, :, node:node + 1], value[:, :, node:node + 1])
        if attention is split_attention:
            return attention(*args, row_mask, scaling=dim ** -0.5, cached_kv=cache)[0]
        cache = [torch.cat([c, torch.randn(1, kv_heads, padded - past - depth, dim)], 2) for c in cache]
        cached_mask, *window = window_inputs(row_mask, torch.tensor([[past + depth]]), past + depth, padded)
        return attention(*args, cached_mask, scaling=dim ** -0.5, cached_kv=cache, recent=tuple(window))[0]

    assert max(tree.depths) <= RECENT_DEPTH
    groups = heads // kv_heads
    a, b = torch.randn(1, kv_heads, groups * n, dim), torch.randn(1, kv_heads, dim, padded)
    if not torch.equal((a @ b)[:, :, :groups], a[:, :, :groups] @ b):
        pytest.skip(f"PyTorch's matmul on this CPU ({torch.backends.cpu.get_cpu_capability()}) computes a row of a "
                    f"{groups * n}-row product otherwise than of a {groups}-row one, so the attention's sum order "
                    f"cannot be checked bitwise in eager PyTorch here (the exported graph is checked on OpenVINO)")
    for node in range(n):
        assert torch.equal(alone(recent_attention, node)[0, 0], got[0, node]), node
    split, _ = split_attention(module, query, key, value, torch.cat([mask, mask.new_zeros(1, 1, n, 0)], 3),
                               scaling=dim ** -0.5, cached_kv=cached)
    assert not all(torch.equal(alone(split_attention, node)[0, 0], split[0, node]) for node in range(n))


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_runs_batch_one_calls_at_a_compiled_row_count_with_the_dynamic_models_outputs(tiny, fast):
    """Rows are padded up to a model compiled for that row count (masked rows): the logits, hidden states and cache
    rows a call gives are the dynamic model's, and only the call's own rows reach the cache."""
    model = fast["openvino"].model
    assert model._rows(3) == 4 and model._rows(1) == 1 and model._rows(16) == 16 and model._rows(17) is None
    prompt, tree = torch.arange(10, 30)[None], TokenTree(torch.tensor([5, 7, 9]), torch.tensor([-1, 0, 0]))
    outputs, by_rows, static = [], model.by_rows, model.static
    try:
        for compiled_rows in (by_rows, {}):
            model.by_rows, model.static = compiled_rows, static if compiled_rows else None
            with torch.inference_mode():
                cache = DynamicCache()
                model(input_ids=prompt, past_key_values=cache, use_cache=True)
                out = verify_tree(model, cache, tree)
                step = model(input_ids=torch.tensor([[3]]), past_key_values=cache, output_hidden_states=True)
            outputs.append((out.logits, step.logits, step.hidden_states, cache.layers[0].keys))
    finally:
        model.by_rows, model.static = by_rows, static
    (tree_a, step_a, hidden_a, keys_a), (tree_b, step_b, hidden_b, keys_b) = outputs
    assert tree_a.shape == tree_b.shape == (3, tiny.model.config.vocab_size)
    assert keys_a.shape[-2] == keys_b.shape[-2] == 20 + 3 + 1  # the padding rows never reach the cache
    assert torch.allclose(tree_a, tree_b, atol=1e-5) and torch.allclose(step_a, step_b, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(hidden_a, hidden_b))
    assert torch.allclose(keys_a, keys_b, atol=1e-5)


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_reads_each_cache_in_place_and_another_cache_between_its_steps_changes_nothing(tiny, fast):
    """A cache's layers are views of its own buffer, which OpenVINO reads as the call's input: a step copies nothing
    in (the layers stay views of the same memory, grown by the new rows); a second cache decoding between the first's
    steps leaves what the first holds and computes as it was alone."""
    model = fast["openvino"].model

    def steps(cache, tokens):
        with torch.inference_mode():
            return [model(input_ids=torch.tensor([[t]]), past_key_values=cache).logits[0, -1] for t in tokens]

    def prefilled(prompt):
        cache = DynamicCache()
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]), past_key_values=cache)
        return cache

    alone = prefilled(list(range(10, 30)))
    expected = steps(alone, [5, 6, 7, 8])
    first, second = prefilled(list(range(10, 30))), prefilled(list(range(40, 70)))
    got = steps(first, [5, 6])
    buffer = model.buffers.holding(first, 0)
    assert buffer.holds(first) and not buffer.holds(second)
    keys = first.layers[0].keys.clone()
    steps(second, [1, 2, 3])
    assert torch.equal(first.layers[0].keys, keys) and model.buffers.holding(second, 0) is not buffer
    got += steps(first, [7, 8])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))
    assert first.get_seq_length() == alone.get_seq_length() == 24
    assert buffer.holds(first)  # still read in place


def test_a_buffer_holds_a_cache_whose_layers_view_it_and_no_other():
    """The runtimes' cache buffer (execution/cache_views.py) reads a cache in place only where its layers are the
    buffer's own: its BufferLayers, cropped and grown by their length alone, and not a cache with one layer moved
    elsewhere or another cache's layers; a layer's keys and values are the buffer's leading slots, written in place."""
    from transformers import LlamaConfig
    from transformers.cache_utils import DynamicLayer

    from specbench.execution.cache_views import CacheBuffer, layer_tensors, view_layers
    from specbench.verification import cache_bytes

    config = LlamaConfig(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, hidden_size=8)
    buffer = CacheBuffer((6, 2, 4), 16)
    buffer.memory.copy_(torch.randn(buffer.memory.shape))
    cache, other = DynamicCache(config=config), DynamicCache(config=config)
    view_layers(cache, buffer, 5, 3)
    assert buffer.holds(cache) and cache.get_seq_length() == 5
    assert torch.equal(cache.layers[1].values, buffer.memory[3, :, :, :5])
    assert cache_bytes(cache) == sum(t.numel() * t.element_size() for t in layer_tensors(cache)) == 3 * 2 * 5 * 8 * 4
    cache.crop(-2)
    assert buffer.holds(cache) and cache.get_seq_length() == 3 and cache.layers[2].keys.shape[-2] == 3
    cache.layers[0].keys[..., 1, :] = 7.0  # a commit writes through the view
    assert torch.all(buffer.memory[0, :, :, 1] == 7.0)
    view_layers(cache, buffer, 4, 3)
    assert all(layer.get_seq_length() == 4 for layer in cache.layers) and buffer.holds(cache)
    view_layers(other, CacheBuffer((6, 2, 4), 16), 5, 3)
    assert not buffer.holds(other)
    moved = DynamicLayer()
    moved.update(cache.layers[2].keys.clone(), cache.layers[2].values.clone())
    cache.layers = [*cache.layers[:2], moved]
    assert not buffer.holds(cache)
    with pytest.raises(TypeError, match="written by its runtime"):
        other.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)
    other.reset()
    assert other.get_seq_length() == 0


def test_a_dead_caches_buffer_serves_the_next_cache_of_its_capacity_and_no_live_one():
    """CacheBuffers hands a dead cache's buffer to the next cache of that capacity (a new one is zeroed and faulted in
    on the timed path), never a live cache's, and keeps the last SPARE capacities only."""
    from specbench.execution.cache_views import CACHE_STEP, CacheBuffers

    buffers = CacheBuffers((6, 2, 4))
    cache = DynamicCache()
    first = buffers.holding(cache, 10)
    live = DynamicCache()
    assert buffers.holding(live, 10) is not first  # both alive: each its own
    del cache
    again = DynamicCache()
    assert buffers.holding(again, CACHE_STEP) is first  # the same capacity
    grown = buffers.holding(again, CACHE_STEP + 1)
    assert grown is not first and grown.capacity == 2 * CACHE_STEP
    del again, live  # both of its buffers and the live one's come back: three, of which the last two are kept
    kept = [buffers.holding(DynamicCache(), c * CACHE_STEP) for c in (1, 2)]
    assert kept[1] is grown and kept[0] is not first


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_verifies_past_a_cache_step_and_keeps_only_the_logits_and_hidden_states_asked_for(tiny, fast):
    """A cache outgrowing its buffer (CACHE_STEP tokens) moves into a larger one once and decodes on; a tree verify
    there equals eager one-token forwards, after an accepted branch is committed in place too. A prefill asked for
    the last row's logits (logits_to_keep=1) projects that row alone, and hidden states come out only when asked."""
    from specbench.execution.openvino.forward import CACHE_STEP

    model = fast["openvino"].model
    prompt = torch.arange(CACHE_STEP - 6)[None] % 200 + 10
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13]), torch.tensor([-1, 0, 0, 1, 3]))  # deeper than the slots left
    with torch.inference_mode():
        cache = DynamicCache()
        first = model(input_ids=prompt, past_key_values=cache, logits_to_keep=1)
        assert first.logits.shape == (1, 1, tiny.model.config.vocab_size) and first.hidden_states is None
        full = model(input_ids=prompt, past_key_values=DynamicCache(), output_hidden_states=True)
        assert torch.allclose(first.logits[0, 0], full.logits[0, -1], atol=1e-5)
        assert len(full.hidden_states) == tiny.model.config.num_hidden_layers + 1
        assert full.hidden_states[-1].shape == (1, prompt.shape[1], tiny.model.config.hidden_size)
        for token in (3, 4, 5):
            model(input_ids=torch.tensor([[token]]), past_key_values=cache)
        past = cache.get_seq_length()
        logits = verify_tree(model, cache, tree).logits
        assert model.buffers.holding(cache, 0).capacity == 2 * CACHE_STEP
        commit_path(cache, past, [0, 1, 3])
        after = verify_tree(model, cache, TokenTree(torch.tensor([13]), torch.tensor([-1]))).logits
        context = torch.cat([prompt[0], torch.tensor([3, 4, 5])])
        for node in range(len(tree)):
            ref = tiny.model(input_ids=torch.cat([context, tree.tokens[tree.path_to(node)]])[None]).logits[0, -1]
            assert torch.allclose(logits[node], ref, atol=1e-4), node
        ref = tiny.model(input_ids=torch.cat([context, torch.tensor([5, 7, 11, 13])])[None]).logits[0, -1]
        assert torch.allclose(after[0], ref, atol=1e-4)
        assert model.buffers.holding(cache, 0).holds(cache)


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_decodes_a_batch_of_padded_sequences_as_each_alone(tiny, fast):
    """A batch of several sequences (left padding, a 2D mask) runs the dynamic model with its cache copied in; each
    sequence's logits equal its own batch-1 decoding."""
    model = fast["openvino"].model
    prompts = [list(range(10, 30)), list(range(40, 52))]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache)
        step = model(input_ids=torch.tensor([[3], [4]]), attention_mask=torch.cat([mask, torch.ones(2, 1)], 1).long(),
                     position_ids=positions[:, -1:] + 1, past_key_values=cache)
        for row, (prompt, token) in enumerate(zip(prompts, (3, 4))):
            alone = DynamicCache()
            first = model(input_ids=torch.tensor([prompt]), past_key_values=alone).logits[0, -1]
            second = model(input_ids=torch.tensor([[token]]), past_key_values=alone).logits[0, -1]
            assert torch.allclose(out.logits[row, -1], first, atol=1e-4), row
            assert torch.allclose(step.logits[row, -1], second, atol=1e-4), row


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_compiles_only_the_row_counts_its_memory_budget_holds(tiny, fast, monkeypatch):
    """Every row count is a compiled model of its own (a resident copy of the compiled weights): the first is always
    built, the next only while the largest one's measured cost fits what is left of STATIC_MEMORY of the available
    memory; a call no compiled row count holds runs the dynamic model, with the same outputs."""
    from specbench.execution import openvino
    from specbench.execution.openvino import compile as compiling

    full = fast["openvino"].model  # built first: under the patch below it would be as lean
    monkeypatch.setattr(compiling, "available_bytes", lambda: 1)  # nothing to spare: the first shape only
    lean = with_backend(tiny, "openvino").model
    assert list(lean.by_rows) == [openvino.STATIC_ROWS[0]]
    prompt, tree = torch.arange(10, 30)[None], TokenTree(torch.tensor([5, 7, 9]), torch.tensor([-1, 0, 0]))
    logits = []
    for model in (lean, full):
        with torch.inference_mode():
            cache = DynamicCache()
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
            logits.append(verify_tree(model, cache, tree).logits)
    assert lean._rows(3) is None and full._rows(3) is not None
    assert torch.allclose(logits[0], logits[1], atol=1e-5)


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_runs_each_cache_capacity_on_a_static_model_with_the_row_models_outputs(tiny, fast, monkeypatch):
    """A call on a cache buffer runs the model of the fewest SIZED_ROWS holding it and the buffer's capacity, every
    shape static, compiled once on first use: its logits, hidden states and cache rows are the row model's (a 3-node
    tree runs 3 rows, where the row models pad it to 4). compile_ahead compiles the capacities a context range
    takes for every row count up to the most met so far; where one more would leave less
    free memory than the floor, a size runs the row model."""
    from specbench.execution.openvino import compile as compiling
    from specbench.execution.openvino.compile import StaticModels
    from specbench.execution.openvino.forward import CACHE_STEP, PAST

    # every size fits the memory floor here, whatever the test workers beside this one hold (its own part below), and
    # whatever an earlier test on this module's shared route met
    monkeypatch.setattr(compiling, "available_bytes", compiling.total_bytes)
    model = fast["openvino"].model
    static = model.static
    monkeypatch.setattr(static, "full", False)
    prompt, tree = torch.arange(10, 30)[None], TokenTree(torch.tensor([5, 7, 9]), torch.tensor([-1, 0, 0]))
    outputs = []
    try:
        for runs in (static, None):
            model.static = runs
            with torch.inference_mode():
                cache = DynamicCache()
                model(input_ids=prompt, past_key_values=cache, use_cache=True)
                out = verify_tree(model, cache, tree, want_hidden=True)
                step = model(input_ids=torch.tensor([[3]]), past_key_values=cache, output_hidden_states=True)
            outputs.append((out.logits, out.hidden, step.logits, step.hidden_states, cache.layers[0].keys))
    finally:
        model.static = static
    assert {(3, CACHE_STEP), (1, CACHE_STEP)} <= set(static.requests)
    assert model._sized(3, CACHE_STEP) == (3, static.requests[3, CACHE_STEP]) and model._rows(3) == 4
    # a sized tree reads L(n) where the call really runs: 5 rows pad to the 8-row model, 3 run as 3
    assert [model.padded_rows(n) for n in (1, 3, 5, 8, 17)] == [1, 3, 8, 8, 17]
    request = static.requests[1, CACHE_STEP]
    assert tuple(request.get_input_tensor(PAST).shape)[3] == CACHE_STEP
    for a, b in zip(*outputs):
        a, b = (a, b) if isinstance(a, torch.Tensor) else (torch.stack(a), torch.stack(b))
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    model.compile_ahead(20, CACHE_STEP + 10)
    assert {(rows, 2 * CACHE_STEP) for rows in (1, 2, 3)} <= set(static.requests)  # 2: fewer rows than met
    assert static.requests[1, CACHE_STEP] is request
    assert not any(capacity > 2 * CACHE_STEP for _, capacity in static.requests)

    lean, left = StaticModels(static.xml, static.properties), iter([10, 6, 4])  # GiB free before each compile
    monkeypatch.setattr(compiling, "total_bytes", lambda: 16 * 2**30)  # the floor: 8 GiB free
    monkeypatch.setattr(compiling, "available_bytes", lambda: next(left) * 2**30)
    assert lean.request(1, CACHE_STEP) is not None  # 10 GiB free: above the floor
    lean.cost = 2**30  # as if the compile had taken 1 GiB: 6 - 1 is under the floor, and so is every later one
    assert lean.request(2, CACHE_STEP) is None and lean.request(3, CACHE_STEP) is None and lean.full
    assert lean.request(1, CACHE_STEP) is lean.requests[1, CACHE_STEP] and lean.request(1, 2 * lean.context) is None


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_runs_a_prompt_in_one_call_of_the_prefill_ir_with_the_split_attention_irs_numbers(tiny, fast):
    """A prompt on an empty cache that no compiled row count holds runs in one call of the prefill IR, whose attention
    is one SDPA a layer (the split-attention IR has none): its logits, hidden states and cached keys and values are
    the split-attention IR's within float rounding, a step and a tree verify after it read what it cached, and plain
    decoding and PLD on it return the split-attention prefill's tokens. (How the CPU plugin runs that SDPA depends on
    the CPU, so the IR is read, not the compiled model.)"""
    import collections

    import openvino as ov

    from specbench.execution.openvino.attention import ATTENTION, PREFILL_ATTENTION
    from specbench.execution.openvino.export import exported

    model = fast["openvino"].model
    prefill = model.prefill
    fp32 = with_dtype(tiny, "float32")
    ops = [collections.Counter(op.get_type_name() for op in ov.Core().read_model(exported(fp32, "fp", layout))
                               .get_ordered_ops()) for layout in (ATTENTION, PREFILL_ATTENTION)]
    assert ops[0]["ScaledDotProductAttention"] == 0
    assert ops[1]["ScaledDotProductAttention"] == tiny.model.config.num_hidden_layers
    calls, infer = [], prefill.request.infer
    prefill.request.infer = lambda *a, **k: calls.append(1) or infer(*a, **k)
    prompt, tree = torch.arange(10, 50)[None], TokenTree(torch.tensor([5, 7, 9]), torch.tensor([-1, 0, 0]))
    texts = ["the cat sat on the mat and the cat sat on the hat", "hello world " * 6]
    outputs = []

    def decode(drafter, text):
        return Decoder(model, drafter, ExactAcceptance(), SamplingParams(), 24, tiny.eos_token_ids,
                       max_context=tiny.max_context).generate(tiny.tokenizer(text)["input_ids"]).tokens

    try:
        for forward in (prefill, None):
            model.prefill = forward
            calls.clear()
            with torch.inference_mode():
                cache = DynamicCache()
                first = model(input_ids=prompt, past_key_values=cache, output_hidden_states=True)
                step = model(input_ids=torch.tensor([[3]]), past_key_values=cache).logits
                verify = verify_tree(model, cache, tree).logits
            tokens = [decode(drafter, text) for text in texts
                      for drafter in (PlainDrafter(), PromptLookupDrafter(fast["openvino"], NativePolicy(8)))]
            outputs.append((first, cache, step, verify, tokens))
            assert len(calls) == (1 + 2 * len(texts) if forward is not None else 0)  # every prompt, one call each
    finally:
        model.prefill = prefill
        del prefill.request.infer
    (first_a, cache_a, step_a, verify_a, tokens_a), (first_b, cache_b, step_b, verify_b, tokens_b) = outputs
    assert torch.allclose(first_a.logits, first_b.logits, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(first_a.hidden_states, first_b.hidden_states))
    assert all(torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
               for a, b in zip(cache_a.layers, cache_b.layers))
    assert torch.allclose(step_a, step_b, atol=1e-5) and torch.allclose(verify_a, verify_b, atol=1e-5)
    assert tokens_a[0::2] == tokens_a[1::2] == tokens_b[0::2] == tokens_b[1::2]


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.slow
def test_greedy_speculation_on_the_backend_equals_its_plain_decoding_and_the_eager_output(tiny, fast, backend):
    def decode(model, drafter, prompt):
        return Decoder(model, drafter, ExactAcceptance(), SamplingParams(), 32, tiny.eos_token_ids,
                       max_context=tiny.max_context).generate(prompt).tokens

    texts = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]
    accepted = 0
    for text in texts:
        prompt = tiny.tokenizer(text)["input_ids"]
        eager = decode(tiny.model, PlainDrafter(), prompt)
        plain = decode(fast[backend].model, PlainDrafter(), prompt)
        pld = Decoder(fast[backend].model, PromptLookupDrafter(fast[backend], NativePolicy(11)), ExactAcceptance(),
                      SamplingParams(), 32, tiny.eos_token_ids, max_context=tiny.max_context).generate(prompt)
        assert pld.tokens == plain == eager
        accepted += sum(s.accepted for s in pld.steps)
    assert accepted > 0


@pytest.mark.slow
def test_compile_reports_its_compile_time_apart(tiny, fast):
    model = fast["compile"].model
    prompt = tiny.tokenizer("hello world")["input_ids"]
    # a step after the (eager) prefill compiles, unless a test before it on this xdist worker did
    Decoder(model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 2, tiny.eos_token_ids,
            max_context=tiny.max_context).generate(prompt)
    stats = model.compile_stats
    assert stats.graphs >= 1 and stats.seconds > 0


def test_backends_refuse_what_they_cannot_run_in_one_line(tiny):
    with pytest.raises(SpecbenchError, match="model.backend='tvm' is unknown; valid choices: auto, eager, prepacked, compile"):
        with_backend(tiny, "tvm")
    with pytest.raises(SpecbenchError, match="resolved by the evaluator"):
        with_backend(tiny, "auto")
    packed = with_backend(tiny, "prepacked")
    with pytest.raises(SpecbenchError, match="cast the eager model to bfloat16, then apply backend 'prepacked'"):
        with_dtype(packed, "bfloat16")
    reason = supported("prepacked", torch.bfloat16, torch.device("cpu"))
    if reason is None:
        pytest.skip("this CPU packs bf16 (AVX-512 or AVX-NE-CONVERT): nothing to refuse")
    with pytest.raises(SpecbenchError, match="model.backend=prepacked cannot run torch.bfloat16 here: oneDNN cannot"):
        with_backend(with_dtype(tiny, "bfloat16"), "prepacked")


def test_auto_falls_back_to_eager_only_where_no_backend_asked_for_can_run_the_model(tiny):
    """The own-graph routes keep one growing buffer per layer: a Gemma 3 (sliding-window layers) runs on neither, so
    model.backend=auto measures eager for it; a full-attention model keeps the list it was given."""
    from transformers import Gemma3TextConfig

    from specbench.execution.backends import or_eager

    cpu, own = torch.device("cpu"), ["onnxruntime", "openvino"]
    sliding = Gemma3TextConfig(layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2)
    assert "sliding_attention" in supported("onnxruntime", torch.float32, cpu, sliding)
    assert or_eager(own, cpu, sliding) == [*own, "eager"]
    assert or_eager(own, cpu, tiny.model.config) == own
    assert supported("onnxruntime", torch.float32, cpu, tiny.model.config) is None


def test_a_draft_sliced_from_the_eager_target_runs_on_the_backend_and_stays_lossless(tiny, fast):
    """build_drafter slices the early-exit draft from the eager model, then runs it on the run's backend."""
    from specbench.config import build
    from specbench.evaluation.methods import build_drafter
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["model=tiny_random", "method=draft_model", "method.checkpoint=null",
                       "method.draft.early_exit_layers=1", "tree=chain", "tree.budget=4"])
    drafter = build_drafter(cfg.method.drafter, tiny, build(cfg.tree), "prepacked")
    assert drafter.draft.backend == "prepacked" and isinstance(drafter.draft.model.lm_head, PackedLinear)
    prompt = tiny.tokenizer("the cat sat on the mat and the cat sat")["input_ids"]
    run = Decoder(fast["prepacked"].model, drafter, ExactAcceptance(), SamplingParams(), 24, tiny.eos_token_ids,
                  max_context=tiny.max_context).generate(prompt)
    plain = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 24, tiny.eos_token_ids,
                    max_context=tiny.max_context).generate(prompt)
    assert run.tokens == plain.tokens and any(s.tree_size > 1 for s in run.steps)


def test_a_run_on_a_fast_backend_checks_every_method_against_eager_plain_decoding(tmp_path):
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    overrides = ["model=tiny_random", "model.backend=prepacked", "eval.dtype=float32", "eval.num_prompts=2",
                 "eval.max_new_tokens=16", "eval.warmup=0", "eval.memory_probe=false", "eval.fastest_plain=false",
                 "eval.first_turn_only=true", "eval.eager_reference=true", "eval.latency_profile=false"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert list(summary.index) == ["plain", "plain@eager", "pld"]
    assert summary.loc["plain", "backend"] == "prepacked"
    assert summary.loc["plain@eager", "backend"] == "eager"
    assert (summary.loc[["plain", "pld"], "eager_match"] == 1.0).all()


def test_auto_runs_on_the_profiles_cheapest_verify_and_judges_it_against_the_fastest_plain_decoding(tmp_path,
                                                                                                     monkeypatch):
    """A hand-made profile: prepacked fp32 is flat in n (cheapest for trees), eager bf16 is cheapest for one token."""
    import pandas as pd

    from specbench.hardware.measured.machine import machine_info
    from specbench.hardware.measured.machine_profile import MachineProfile, profile_path
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    cost = {("eager", "float32"): lambda n: 50 + 5 * n, ("prepacked", "float32"): lambda n: 40 + 1 * n,
            ("eager", "bfloat16"): lambda n: 10 + 15 * n}
    rows = [{"backend": b, "dtype": d, "context": c, "tokens": n, "ms": float(f(n))}
            for (b, d), f in cost.items() for c in (128, 256, 1024) for n in (1, 2, 4, 8, 16, 32, 64)]
    peaks = {"peak_tflops": {"float32": 0.1, "bfloat16": 0.1}, "mem_bandwidth_gbs": 10.0, "layer_overhead_ms": 0.1,
             "memory_gb": 8.0}
    profile = MachineProfile({**machine_info(), "unsupported": {"prepacked/bfloat16": "not here"}}, "cpu",
                             "tiny_random", peaks, pd.DataFrame(rows))
    profile_path("tiny_random", "cpu").parent.mkdir(parents=True)
    profile_path("tiny_random", "cpu").write_text(profile.to_json())
    overrides = ["model=tiny_random", "model.backend=auto", "eval.dtype=auto", "eval.fastest_plain=true",
                 "eval.profile_backends=[eager,prepacked]", "eval.profile_weights=[fp]", "eval.num_prompts=1", "eval.max_new_tokens=12",
                 "eval.warmup=0", "eval.memory_probe=false", "eval.first_turn_only=true", "tree.budget=8",
                 "eval.profile_context=8"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert list(summary.index) == ["plain", "plain@eager/bfloat16", "pld"]
    # L(8): 48 vs 90, 130 ms; an 8-token prompt and 12 tokens: bf16 130 + 12 x 25 < prepacked 48 + 12 x 41
    assert tuple(summary.loc["pld", ["backend", "dtype"]]) == ("prepacked", "float32")
    assert tuple(summary.loc["plain@eager/bfloat16", ["backend", "dtype"]]) == ("eager", "bfloat16")
    assert summary.loc["pld", "fastest_plain"] in ("plain", "plain@eager/bfloat16")


@pytest.mark.parametrize("task", ["eval", "profile"])
@pytest.mark.parametrize("bad", ["[]", "[auto]", "[eager,tvm]"])
def test_a_bad_list_of_backends_to_profile_is_refused_before_any_model_loads(task, bad, tmp_path, monkeypatch):
    import importlib

    from tests.conftest import compose_cfg

    monkeypatch.setattr(f"specbench.tasks.{task}.setup_target", lambda *a, **k: pytest.fail("loaded a model"))
    cfg = compose_cfg([f"task={task}", "model=tiny_random", "model.backend=auto", f"eval.profile_backends={bad}"],
                      tmp_path)
    with pytest.raises(SpecbenchError, match="eval.profile_backends=.* is invalid: give one or more of eager, "
                                             "prepacked, compile"):
        importlib.import_module(f"specbench.tasks.{task}").run(cfg)


@pytest.mark.slow
def test_a_compiled_quantised_target_decodes_in_two_graphs_and_stays_lossless(tiny):
    """Fused projections trace (dynamo skips their memo; the graph's CSE merges the repeated GEMM), a prefill runs
    eager, and cached tensors are made contiguous before each compiled call, so a whole decode, accepted drafts and
    rejected ones (crops) included, compiles two graphs: the one-token step and the multi-row verify. Speculation on
    the compiled target equals its plain decoding and the eager quantised target's."""
    quant = with_weights(tiny, "int8")
    compiled = with_backend(quant, "compile")

    def decode(model, drafter, prompt):
        return Decoder(model, drafter, ExactAcceptance(), SamplingParams(), 32, tiny.eos_token_ids,
                       max_context=tiny.max_context).generate(prompt)

    accepted = 0
    for text in ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]:
        prompt = tiny.tokenizer(text)["input_ids"]
        eager = decode(quant.model, PlainDrafter(), prompt).tokens
        plain = decode(compiled.model, PlainDrafter(), prompt).tokens
        pld = decode(compiled.model, PromptLookupDrafter(compiled, NativePolicy(11)), prompt)
        assert pld.tokens == plain == eager
        accepted += sum(s.accepted for s in pld.steps)
    assert accepted > 0
    assert compiled.model.compile_stats.graphs == 2


def test_compile_freezes_the_weights_into_its_graphs(tiny):
    """On CPU the compiled forward runs inductor's freezing: the weights become constants of the graph (packed once),
    so a weight changed after compiling changes nothing there, while the eager model sees it. Freezing only finds the
    weights when dynamo installs them on the graph (prepare_freezing); without that they stayed graph inputs and
    nothing was packed. The last layer's MLP is changed, which the prefill's cache does not depend on."""
    target = dataclasses.replace(tiny, model=copy.deepcopy(tiny.model))
    compiled = with_backend(target, "compile").model
    ids = torch.tensor([tiny.tokenizer("the cat sat on the mat")["input_ids"]])
    cache = DynamicCache(config=target.model.config)
    with torch.inference_mode():
        compiled(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)  # the prefill runs eager

        def step(model):
            logits = model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True).logits
            cache.crop(-1)
            return logits

        before, eager_before = step(compiled), step(target.model)
        target.model.model.layers[-1].mlp.down_proj.weight.mul_(0)
        after, eager_after = step(compiled), step(target.model)
    assert not torch.equal(eager_before, eager_after)  # the change matters to a forward that reads the weights
    assert torch.equal(before, after)


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
@pytest.mark.slow
def test_a_run_on_openvino_int4_is_lossless_against_its_own_plain_decoding_beside_the_eager_one(tmp_path):
    """model.backend=openvino with int4 weights: NNCF's grid, a target of its own. PLD on it equals its own plain
    decoding on every prompt (in fp32), and the eager float32 plain decoding runs beside it as eval.plain_executions
    asks; the IR is exported once and read back from the cache by a second run."""
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    overrides = ["model=tiny_random", "model.backend=openvino", "model.weights=int4", "eval.dtype=float32",
                 "eval.num_prompts=3", "eval.max_new_tokens=24", "eval.warmup=0", "eval.memory_probe=false",
                 "eval.fastest_plain=false", "eval.first_turn_only=true", "eval.latency_profile=false",
                 "eval.plain_executions=[eager/float32]"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert summary.loc["pld", "backend"] == "openvino" and summary.loc["pld", "weights"] == "int4_g32"
    assert summary.loc["pld", "lossless_reference"] == "plain"
    assert summary.loc["pld", "lossless_match"] == 1.0 and summary.loc["pld", "tau"] > 1.0
    assert summary.loc["plain@eager/float32", "backend"] == "eager"


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_openvino_w4a8_is_the_int4_ir_compiled_with_activations_quantised_on_the_fly(tiny, fast):
    """w4a8_g<group> reads the int4_g<group> IR (no second export) and compiles it, every row count too, with
    OpenVINO's dynamic quantisation on, where int4 keeps it off; the same weights give nearly the same logits. Where
    this CPU's plugin quantises no activations (quantises_activations, asked of the plugin) w4a8 computes int4's
    numbers bitwise and claims what int4 claims of a verify's rows (float rounding), else it claims nothing."""
    from specbench.execution import openvino
    from specbench.execution.row_claims import DIFFERS, ROUNDING
    from specbench.execution.value import Execution
    from specbench.models.loading import cache_dir

    runs = {w: Execution("openvino", "float32", w).apply(tiny) for w in ("int4_g32", "w4a8_g32")}
    assert runs["w4a8_g32"].weights == "w4a8_g32" and runs["w4a8_g32"].backend == "openvino"
    folders = {p.name.rsplit("-", 1)[-1] for p in cache_dir("openvino").glob(f"{tiny.name}-*-forward-*")}
    assert "w4a8_g32" not in folders and "int4_g32" in folders
    for weights, group in (("int4_g32", 0), ("w4a8_g32", openvino.DYNAMIC_GROUP)):
        model = runs[weights].model
        for request in (model.request, *model.by_rows.values()):
            assert request.get_compiled_model().get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == group, weights
    prompt = torch.arange(10, 30)[None]
    with torch.inference_mode():
        logits = [runs[w].model(input_ids=prompt, past_key_values=DynamicCache()).logits for w in runs]
    assert torch.allclose(logits[0], logits[1], atol=0.1)
    assert runs["int4_g32"].model.claims == ROUNDING
    if openvino.quantises_activations():
        assert runs["w4a8_g32"].model.claims == DIFFERS
    else:
        assert runs["w4a8_g32"].model.claims == ROUNDING and torch.equal(logits[0], logits[1])


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
@pytest.mark.slow
def test_openvino_w4a8r_verifies_a_tree_bitwise_as_its_own_one_token_forwards_and_speculates_losslessly(tiny):
    """w4a8r_g<group> (dynamic quantisation, row-invariant): each tree node's logits equal, bitwise, those of one-token
    forwards of the same model along its path after a prefill deeper than the attention's window (run in one call of
    the split-attention IR, as plain decoding's), a chain that deep after it runs in pieces, and greedy speculation
    returns its plain decoding."""
    from specbench.execution.value import Execution

    run = Execution("openvino", "float32", "w4a8r_g32").apply(tiny)
    model = run.model
    assert model.row_invariant and min(model.by_rows) == 2 and model.claims == "bitwise"
    assert model.prefill is not None and not model.prefill.row_invariant
    prompt = torch.arange(10, 50)[None]  # deeper than RECENT_DEPTH
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13]), torch.tensor([-1, 0, 0, 1, 3]))
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        logits = verify_tree(model, cache, tree).logits
        for node in range(len(tree)):
            one = DynamicCache()
            model(input_ids=prompt, past_key_values=one, use_cache=True)
            for token in tree.tokens[tree.path_to(node)]:
                out = model(input_ids=token.view(1, 1), past_key_values=one, use_cache=True).logits[0, -1]
            assert torch.equal(logits[node], out), node
        chain = torch.arange(60, 80)[None]  # 20 rows past the cache: in pieces, each row as its one-token forward
        at_once, one_by_one = DynamicCache(), DynamicCache()
        for cache in (at_once, one_by_one):
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
        pieces = model(input_ids=chain, past_key_values=at_once, use_cache=True).logits[0]
        for row, token in enumerate(chain[0]):
            out = model(input_ids=token.view(1, 1), past_key_values=one_by_one, use_cache=True).logits[0, -1]
            assert torch.equal(pieces[row], out), row
    texts = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]
    for text in texts:
        prompt = tiny.tokenizer(text)["input_ids"]
        plain, pld = (Decoder(model, drafter, ExactAcceptance(), SamplingParams(), 32, tiny.eos_token_ids,
                              max_context=tiny.max_context).generate(prompt).tokens
                      for drafter in (PlainDrafter(), PromptLookupDrafter(run, NativePolicy(8))))
        assert pld == plain


@pytest.mark.parametrize("override, message", [
    ("model.weights=w4a8", "model.weights=w4a8 with model.backend=eager: .*set model.backend=openvino"),
    ("eval.plain_executions=[eager/bfloat16/w4a8_g64]", "entry 'eager/bfloat16/w4a8_g64' is invalid: .*openvino"),
    ("model.weights=w8a8s", "^model.weights=w8a8s with model.backend=eager: w8a8s is built into ONNX Runtime's "
                            "graph .*; set model.backend=onnxruntime$"),
    ("eval.plain_executions=[eager/float32/w8a8s]", "entry 'eager/float32/w8a8s' is invalid: .*; give "
                                                    "onnxruntime/float32/w8a8s$"),
])
def test_a_backends_own_format_anywhere_else_is_one_line_before_the_model_loads(override, message, tmp_path,
                                                                               monkeypatch):
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    monkeypatch.setattr(eval_task, "setup_target", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SpecbenchError, match=message):
        eval_task.run(compose_cfg(["model=tiny_random", "model.backend=eager", override], tmp_path / "run"))


@pytest.mark.parametrize("override, message", [
    ("eval.dtype=bfloat16", "model.backend=openvino with eval.dtype=bfloat16: the openvino backend runs float32"),
    ("model.weights=w8a8", "model.backend=openvino with model.weights=w8a8: .*not w8a8"),
    ("model.weights=int4 model.group_size=48", "^model.group_size=48 is invalid for model tiny_random on "
     "model.backend=openvino: NNCF groups every linear's input channels by it, so it must divide each of them "
     r"\(64, 128\); give one of 16, 32, 64$"),
    ("model.weights=int4 model.group_size=0", "^model.group_size=0 is invalid for int4 weights on "
     "model.backend=openvino: NNCF compresses a linear's input channels in groups"),
    ("model.weights=w4a8r eval.batch_size=2",
     "model.weights=w4a8r_g32 with eval.batch_size=2: .*one prompt at a time; set eval.batch_size=1"),
])
def test_openvino_settings_it_cannot_run_are_one_line_before_the_model_loads(override, message, tmp_path,
                                                                             monkeypatch):
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    from specbench.tasks import dispatch

    monkeypatch.setattr(eval_task, "setup_target", lambda *a, **k: pytest.fail("the model was loaded"))
    if NO_OPENVINO:
        message = "OpenVINO is not installed"
    cfg = compose_cfg(["model=tiny_random", "model.backend=openvino", "eval.dtype=float32", *override.split()],
                      tmp_path / "run")
    with pytest.raises(SpecbenchError, match=message):
        dispatch(cfg)



def test_int4_groups_are_nncfs_on_openvino_and_atens_elsewhere():
    """NNCF groups a linear's input channels by any size dividing them, aten's int4 kernel takes four sizes: a group
    of 16 or 48 is refused citing aten's kernel on the eager backends only, and openvino's refusal cites NNCF."""
    from specbench.execution.quantize import check_weights
    from specbench.execution.value import Execution

    check_weights("int4", 16, backend="openvino")
    assert Execution.parse("openvino/float32/int4_g48") == ("openvino", "float32", "int4_g48")
    with pytest.raises(SpecbenchError, match="the group sizes aten's CPU int4 kernel takes"):
        check_weights("int4", 16)
    with pytest.raises(SpecbenchError, match="invalid"):
        Execution.parse("eager/float32/int4_g48")
    with pytest.raises(SpecbenchError, match="on model.backend=openvino: NNCF compresses"):
        check_weights("int4", -32, backend="openvino")


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_a_cached_openvino_ir_cut_short_is_exported_again_with_one_notice(tiny, tmp_path, monkeypatch, capsys):
    """An IR whose .bin or .xml was cut short (or that holds no record of a finished export) is found before
    OpenVINO reads it and fails naming no file: it is removed with one notice and exported again, so the next run
    is not refused forever."""
    import openvino as ov

    from specbench.execution.openvino.attention import ATTENTION
    from specbench.execution.openvino.export import MANIFEST, exported

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    xml = Path(exported(tiny, "fp", ATTENTION))
    weights = xml.with_suffix(".bin").read_bytes()
    capsys.readouterr()
    for cut, size in ((xml.with_suffix(".bin"), 1000), (xml, 2000), (xml.parent / MANIFEST, 0)):
        cut.write_bytes(cut.read_bytes()[:size]) if size else cut.unlink()
        assert Path(exported(tiny, "fp", ATTENTION)) == xml
        notice = capsys.readouterr().out
        assert f"notice: the cached OpenVINO export {xml.parent} is unusable" in notice and "exporting" in notice
        assert xml.with_suffix(".bin").read_bytes() == weights
        ov.Core().read_model(str(xml))
    assert Path(exported(tiny, "fp", ATTENTION)) == xml and capsys.readouterr().out == ""  # whole: read as it is
    assert sorted(p.name for p in xml.parent.parent.iterdir()) == [xml.parent.name]  # nothing else left behind


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_a_read_only_cache_holding_the_ir_is_read_and_one_lacking_it_is_one_line(tiny, tmp_path, monkeypatch):
    """A cache mounted read-only that already holds the IR serves it (its compiled blobs are then not cached); only
    an export, which writes, needs a writable cache, and says so in one line naming the folder."""
    from specbench.execution.openvino import compile as ov_compile
    from specbench.execution.openvino import export as ov_export
    from specbench.execution.openvino.attention import ATTENTION
    from specbench.models import loading

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    xml = ov_export.exported(tiny, "fp", ATTENTION)

    def read_only(folder, what, fix):
        raise SpecbenchError(f"{what} '{folder}' cannot be written (Read-only file system): {fix}")

    monkeypatch.setattr(loading, "check_writable", read_only)
    monkeypatch.setattr(ov_export, "check_writable", read_only)
    assert ov_export.exported(tiny, "fp", ATTENTION) == xml
    assert ov_compile.compiled(xml) is not None
    with pytest.raises(SpecbenchError, match=r"^cache folder '.*openvino' cannot be written \(Read-only file "
                                             r"system\): set SPECBENCH_CACHE to a folder you can write"):
        ov_export.exported(tiny, "int8", ATTENTION)


CTRL_C = """
import os, signal, sys
from pathlib import Path
import openvino as ov
from specbench.models import tiny_random
from specbench.execution.openvino.attention import ATTENTION
from specbench.execution.openvino.export import exported, ir_folder

during = sys.argv[1]
tiny, real = tiny_random(dtype="float32"), getattr(ov, during)

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while OpenVINO's own code runs
    return real(*args, **kwargs)

setattr(ov, during, interrupted)
try:
    exported(tiny, "fp", ATTENTION)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
folder = ir_folder(tiny, "forward-fp", ATTENTION)
print("left behind:", sorted(p.name for p in folder.parent.iterdir()) if folder.parent.exists() else [])
setattr(ov, during, real)
print("exported again:", Path(exported(tiny, "fp", ATTENTION)).exists())
"""


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
@pytest.mark.parametrize("during", ["convert_model", "save_model"])
def test_ctrl_c_during_an_openvino_export_is_an_interrupt_and_leaves_no_ir(tmp_path, during):
    """Ctrl-C while OpenVINO converts or saves the IR is held until its C++ code returns (a KeyboardInterrupt inside
    its callbacks terminated the process or came out as 'cannot export this model') and then raised as what it is,
    an interrupt, leaving no folder, whole or half-written, for a later run to read; the next export succeeds. In a
    process of its own: a signal belongs to the process, not to the test worker that shares it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECBENCH_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", CTRL_C, during], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "interrupted: stopping once OpenVINO's" in proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("notice: exporting")]
    assert lines == ["KeyboardInterrupt", "left behind: []", "exported again: True"], proc.stdout


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_eagle_and_medusa_on_openvino_draft_with_its_heads_and_stay_lossless(tiny, fast, tmp_path):
    """On an openvino run what the drafters compute every tree level runs on OpenVINO in int8 (Drafter.on_openvino):
    EAGLE's whole head as one call (its features and draft logits), Medusa's tied LM head, never the target's own
    module; the drafts move within int8's rounding, and the openvino target's verify still decides every token."""
    from specbench.config import build
    from specbench.evaluation.methods import build_drafter
    from specbench.execution.openvino import OpenVinoEagleHead, OpenVinoLinear
    from specbench.execution.openvino.compile import SIZED_ROWS
    from specbench.execution.openvino.forward import CACHE_STEP
    from tests.conftest import compose_cfg, random_medusa_artifact
    from tests.test_eagle import eagle_artifact

    eagle = eagle_artifact(tmp_path / "eagle", tiny)
    medusa = random_medusa_artifact(tmp_path / "medusa", tiny, [[0.6, 0.2], [0.4, 0.2], [0.3, 0.1]])
    prompt = tiny.tokenizer("the cat sat on the mat and the cat sat")["input_ids"]
    target = fast["openvino"].model
    plain = Decoder(target, PlainDrafter(), ExactAcceptance(), SamplingParams(), 24, tiny.eos_token_ids,
                    max_context=tiny.max_context).generate(prompt)
    d = tiny.model.config.hidden_size
    for method, checkpoint in (("eagle", eagle), ("medusa", medusa)):
        cfg = compose_cfg(["model=tiny_random", f"method={method}", f"method.checkpoint={checkpoint}", "tree=chain",
                           "tree.budget=4"])
        eager = build_drafter(cfg.method.drafter, tiny, build(cfg.tree))
        drafter = build_drafter(cfg.method.drafter, tiny, build(cfg.tree), "openvino")
        if method == "eagle":
            assert isinstance(drafter.head, OpenVinoEagleHead)
            # five committed rows from the target's unfused features (the head's fuse runs inside their call), then a
            # tree level of three rows under a tree mask (rows 0 and 2 siblings); the IR's int8 rounding must stay well
            # under what seeing a sibling's row would move the logits by
            torch.manual_seed(0)
            caches, mask = (DynamicCache(), DynamicCache(), DynamicCache()), torch.ones(1, 1, 3, 8, dtype=torch.bool)
            mask[0, 0, :, 5:] = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
            causal = mask.clone()
            causal[0, 0, :, 5:] = torch.ones(3, 3, dtype=torch.bool).tril()
            raw, embeds = torch.randn(1, 5, len(eager.head.layers) * d), torch.randn(1, 5, d)
            for cache in caches[:2]:
                fused = eager.head(eager.head.fuse(raw), embeds, past_key_values=cache)
            out, _ = drafter.head.draft(raw, embeds, past_key_values=caches[2], committed=True)
            assert (out - fused).abs().max() < 0.05 * fused.abs().max()
            features, embeds, positions = torch.randn(1, 3, d), torch.randn(1, 3, d), torch.tensor([[5, 6, 5]])
            kept, seen = (eager.head.lm_head(eager.head(features, embeds, past_key_values=cache, attention_mask=m,
                                                        position_ids=positions))
                          for cache, m in zip(caches, (mask, causal)))
            out, logits = drafter.head.draft(features, embeds, past_key_values=caches[2], attention_mask=mask,
                                             position_ids=positions)
            assert (logits - kept).abs().max() < 0.5 * (seen - kept).abs().max()
            assert out.shape == (1, 3, d) and caches[2].get_seq_length() == 8
        else:
            assert isinstance(drafter.lm_head, OpenVinoLinear)
            x = torch.randn(3, d)
            kept, logits = eager.lm_head(x), drafter.lm_head(x)
        assert not isinstance(tiny.model.get_output_embeddings(), OpenVinoLinear)
        assert torch.allclose(logits, kept, atol=0.05 * kept.abs().max().item()), method
        decoder = Decoder(target, drafter, ExactAcceptance(), SamplingParams(), 24, tiny.eos_token_ids,
                          max_context=tiny.max_context)
        run = decoder.generate(prompt)
        assert run.tokens == plain.tokens and any(s.tree_size > 1 for s in run.steps), method
        if method == "eagle":  # the head's static models too are compiled ahead, for capacities no step reached yet
            forwards, capacities = (drafter.head.levels, drafter.head.committed), (1, 2, 3)
            assert all(c * CACHE_STEP > max(p for _, p in f.static.requests) for f in forwards for c in capacities[1:])
            decoder.compile_ahead(len(prompt), 3 * CACHE_STEP)
            for forward in forwards:
                most = max(rows for rows, _ in forward.static.requests)
                assert {(rows, c * CACHE_STEP) for rows in SIZED_ROWS if rows <= most for c in capacities} \
                    <= set(forward.static.requests)


@pytest.mark.skipif(NO_OPENVINO, reason="openvino or nncf is not installed")
def test_compressing_weights_for_openvino_prints_nothing(capsys):
    """NNCF prints a bitwidth table and a progress bar for every compression; in a run they reached the terminal of
    every openvino run that compressed a drafter's head, saying nothing about the run."""
    from specbench.execution.openvino import OpenVinoLinear

    OpenVinoLinear(torch.nn.Linear(64, 256, bias=False))
    out = capsys.readouterr()
    assert out.out == "" and "Compression" not in out.err, out


def test_the_compiled_blob_cache_keeps_its_newest_blobs_within_its_budget(tmp_path):
    """Blobs of exports no run reads again would stay for good: the oldest go first until the rest fit."""
    import os

    from specbench.execution.openvino.compile import prune_blobs

    for age, name in enumerate(["new", "mid", "old", "oldest"]):
        blob = tmp_path / f"{name}.blob"
        blob.write_bytes(b"x" * 100)
        os.utime(blob, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "notes.txt").write_bytes(b"x" * 1000)  # not a blob: never counted, never removed
    prune_blobs(tmp_path, 250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid.blob", "new.blob", "notes.txt"]
    prune_blobs(tmp_path, 250)  # within the budget: nothing more goes
    assert len(list(tmp_path.glob("*.blob"))) == 2
