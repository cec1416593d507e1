"""Quantised targets, int8/int4 weight-only and w8a8 (execution/quantize.py) and fused projections (execution/linears.py): each kernel computes
each row on its own (bitwise), so tree verification and speculative decoding of the quantised target are exactly
lossless against its own plain decoding; fusing changes no output; bad settings are one error line."""

import pytest
import torch
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.errors import SpecbenchError
from specbench.execution.linears import FusedPart, fuse_projections
from specbench.models import tiny_random
from specbench.models.loading import with_dtype
from specbench.execution.quantize import (
    Int4Linear,
    Int8Linear,
    W8A8Linear,
    check_weights,
    quantised_linear,
    with_weights,
)
from specbench.sampling import SamplingParams
from specbench.trees.native import NativePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import commit_path, verify_tree

FORMATS = [("int8", 32), ("int4", 32), ("int4", 64), ("w8a8", 32)]
DTYPES = ["float32", "bfloat16"]


def _layer(weights: str, group_size: int, out_features: int, in_features: int, dtype: str, seed: int = 0):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    return quantised_linear(linear, weights, group_size).to(getattr(torch, dtype)), linear


# SmolLM2-135M's shapes (q/o, k/v, gate/up, down, fused qkv and gate-up) and odd ones (int4 pads 100 rows to 112)
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (960, 576), (3072, 576), (100, 64), (64, 128)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights,group_size", FORMATS)
@pytest.mark.slow
def test_each_kernel_computes_every_row_of_a_tree_as_it_computes_that_row_alone(weights, group_size, dtype):
    """Row i of an n-row product equals the 1-row product of row i within the activations' rounding on every CPU, and
    bitwise where this CPU's kernel computes each row on its own, for every size a tree verify or a prefill passes
    (the kernels block rows by 4: sizes around each block edge included). Bitwise rows are a property of the kernel
    a CPU dispatches to, so where they are not, the test says what it measured and skips: the machine profile's row
    check then decides whether a verify on these weights is lossless there."""
    rtol = 2 ** -7 if dtype == "bfloat16" else 1e-5
    worst = 0.0
    for out_features, in_features in SHAPES:
        if in_features % group_size:
            continue
        layer, _ = _layer(weights, group_size, out_features, in_features, dtype)
        x = torch.randn(65, in_features).to(getattr(torch, dtype))
        with torch.inference_mode():
            alone = torch.cat([layer(x[i: i + 1]) for i in range(len(x))])
            for n in (2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 64, 65):
                rows = layer(x[:n])
                assert torch.allclose(rows.float(), alone[:n].float(), rtol=rtol, atol=rtol), (out_features, n)
                worst = max(worst, float((rows.float() - alone[:n].float()).abs().max()))
    if worst:
        pytest.skip(f"{weights} {dtype} on this CPU ({torch.backends.cpu.get_cpu_capability()}): rows of a multi-row "
                    f"product differ from the row alone by up to {worst:.2g}, within rounding but not bitwise")


@pytest.mark.parametrize("weights,group_size", [f for f in FORMATS if f[0] != "w8a8"])
def test_a_quantised_linear_is_the_float_one_within_its_rounding(weights, group_size):
    """|y - x w^T| <= |x| (step / 2) summed over the inputs: each weight moves by at most half a quantisation step
    (int8: max |w| / 127 per output channel; int4: (max - min) / 15 per group), and no further."""
    layer, linear = _layer(weights, group_size, 192, 576, "float32")
    w = linear.weight.detach()
    if weights == "int8":
        step = (w.abs().amax(1, keepdim=True) / 127).expand_as(w)
    else:
        groups = w.reshape(len(w), -1, group_size)
        step = ((groups.amax(-1, keepdim=True) - groups.amin(-1, keepdim=True)) / 15).expand_as(groups).reshape_as(w)
    x = torch.randn(8, 576)
    with torch.inference_mode():
        error = (layer(x) - x @ w.T).abs()
    bound = x.abs() @ (step / 2).T
    assert (error <= bound * 1.001 + 1e-5).all()
    assert error.max() > bound.max() / 1000  # it is quantised: not the float layer itself


def test_a_w8a8_linear_is_the_float_one_within_the_rounding_of_both_factors():
    """x and w each move by at most half their step (w: max |w| / 127 per output channel; x: max |x| / 127 per row),
    so |y - x w^T| <= sum_k |x| dw + dx |w| + dx dw, and the int32 sum adds no error of its own."""
    layer, linear = _layer("w8a8", 32, 192, 576, "float32")
    w = linear.weight.detach()
    x = torch.randn(8, 576)
    dw = (w.abs().amax(1, keepdim=True) / 127 / 2).expand_as(w)
    dx = (x.abs().amax(1, keepdim=True) / 127 / 2).expand_as(x)
    with torch.inference_mode():
        error = (layer(x) - x @ w.T).abs()
    bound = x.abs() @ dw.T + dx @ w.abs().T + dx @ dw.T
    assert (error <= bound * 1.001 + 1e-5).all()
    assert error.max() > bound.max() / 1000


@pytest.mark.parametrize("weights,group_size", FORMATS)
def test_with_weights_swaps_every_linear_on_a_view_and_quantises_the_lm_head(tiny, weights, group_size):
    quant = with_weights(tiny, weights, group_size)
    assert isinstance(quant.model.lm_head, {"int8": Int8Linear, "int4": Int4Linear, "w8a8": W8A8Linear}[weights])
    assert not any(isinstance(m, torch.nn.Linear) for m in quant.model.modules())
    assert all(isinstance(m, torch.nn.Linear) for n, m in tiny.model.named_modules() if n.endswith("_proj"))  # intact
    assert isinstance(quant.model.model.layers[0].self_attn.k_proj, FusedPart)
    assert quant.model.model.embed_tokens is tiny.model.model.embed_tokens  # shared, not copied
    assert quant.weights == (f"int4_g{group_size}" if weights == "int4" else weights) and tiny.weights == "fp"
    assert with_weights(quant, weights, group_size) is quant


def _logits_of_paths(model, prompt, tree, path):
    """A tree verify's logits, and after committing `path`, the next one-token verify's."""
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        logits = verify_tree(model, cache, tree).logits
        commit_path(cache, prompt.shape[1], path)
        after = verify_tree(model, cache, TokenTree(torch.tensor([13]), torch.tensor([-1]))).logits
    return logits, after


def _one_token_forwards(model, prompt, path):
    """Logits of the last token of `path` fed one token at a time after the prompt: plain decoding's forwards (each a
    one-node verify, as the decoder runs it)."""
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        for token in path:
            logits = verify_tree(model, cache, TokenTree(token[None], torch.tensor([-1]))).logits[0]
    return logits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights,group_size", FORMATS)
def test_a_tree_verify_of_the_quantised_target_equals_its_one_token_forwards(tiny, weights, group_size, dtype):
    """Each node's logits from one tree forward (4D tree mask, explicit positions) equal the logits of the quantised
    target decoding that node's path one token at a time, within the activations' rounding and with the same argmax.
    The linears are row-invariant bitwise (the kernel test above); the rest is not on every CPU: transformers'
    attention sums a many-row and a one-row product in other orders (fp32: ~1e-8 apart, measured with hooks), and in
    bf16 that is bitwise on an AVX-512 Zen 4 but one bf16 step (2^-7 relative) apart on an AVX2 EPYC."""
    quant = with_dtype(with_weights(tiny, weights, group_size), dtype).model
    prompt = torch.arange(10, 30)[None]
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13]), torch.tensor([-1, 0, 0, 1, 3]))  # two branches, depth 3
    logits, after = _logits_of_paths(quant, prompt, tree, [0, 1, 3])
    refs = [_one_token_forwards(quant, prompt, tree.tokens[tree.path_to(node)]) for node in range(len(tree))]
    refs.append(_one_token_forwards(quant, prompt, torch.tensor([5, 7, 11, 13])))
    for got, ref in zip([*logits, after[0]], refs):
        rtol, atol = (2 ** -6, 2 ** -6) if dtype == "bfloat16" else (0.0, 1e-5)
        assert torch.allclose(got, ref, rtol=rtol, atol=atol) and got.argmax() == ref.argmax()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_w8a8_tree_verify_is_its_one_token_forwards_bitwise(dtype):
    """W8A8 quantises every activation row, so a 1e-8 difference between a tree row and its one-token forward can
    become a whole code step: the model is lossless under speculation only if every row is computed bitwise as alone.
    Its linears are by construction; its attention runs in float64 for that (execution/attention.py row_invariant).
    SmolLM2-135M's attention shape (9 query heads over 3 KV heads of 64) and 300 cached tokens: with float32
    attention the rows differ (up to 8e-6 in fp32 here; 0.17 with 4 layers)."""
    model = tiny_random(hidden_size=576, num_heads=9, num_kv_heads=3, num_layers=2)
    quant = with_dtype(with_weights(model, "w8a8"), dtype).model
    prompt = (torch.arange(300) % 200)[None]
    tree = TokenTree(torch.tensor([5, 7, 9, 11, 13, 15, 17]), torch.tensor([-1, 0, 0, 1, 3, 1, 4]))
    logits, after = _logits_of_paths(quant, prompt, tree, [0, 1, 3, 4, 6])
    refs = [_one_token_forwards(quant, prompt, tree.tokens[tree.path_to(node)]) for node in range(len(tree))]
    refs.append(_one_token_forwards(quant, prompt, torch.tensor([5, 7, 11, 13, 17, 13])))
    equal = all(torch.equal(got, ref) for got, ref in zip([*logits, after[0]], refs))
    if not equal and not _float64_products_rows_alike():
        worst = max(float((got - ref).abs().max()) for got, ref in zip([*logits, after[0]], refs))
        pytest.skip(f"this CPU ({torch.backends.cpu.get_cpu_capability()}) computes a row of a float64 product of "
                    f"several rows otherwise than alone, so w8a8's rows differ by up to {worst:.2g} here: no lossless "
                    f"verify route on this CPU, as the machine profile's row check finds")
    assert equal


def _float64_products_rows_alike() -> bool:
    """Whether this CPU's float64 matmuls, as float64 attention runs them (scores, then weights times values), give a
    row of a many-row product bitwise as that row alone: the kernel property w8a8's row invariance rests on."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 3, 21, 64, dtype=torch.float64), torch.randn(1, 3, 64, 300, dtype=torch.float64), \
        torch.randn(1, 3, 300, 64, dtype=torch.float64)
    p = (q @ k).softmax(-1)
    return all(torch.equal((a @ b)[:, :, i:i + 1], a[:, :, i:i + 1] @ b) for a, b in ((q, k), (p, v)) for i in (0, 20))


def _decode(model, drafter, tiny, prompt, tokens=32):
    return Decoder(model, drafter, ExactAcceptance(), SamplingParams(), tokens, tiny.eos_token_ids,
                   max_context=tiny.max_context).generate(prompt)


TEXTS = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "hello world " * 6]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights,group_size", FORMATS)
def test_greedy_pld_on_the_quantised_target_equals_its_own_plain_decoding(tiny, weights, group_size, dtype):
    quant = with_dtype(with_weights(tiny, weights, group_size), dtype)
    accepted = 0
    for text in TEXTS:
        prompt = tiny.tokenizer(text)["input_ids"]
        plain = _decode(quant.model, PlainDrafter(), tiny, prompt)
        pld = _decode(quant.model, PromptLookupDrafter(quant, NativePolicy(11)), tiny, prompt)
        assert pld.tokens == plain.tokens
        accepted += sum(s.accepted for s in pld.steps)
    assert accepted > 0  # drafts were accepted: the tree path was exercised


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights,group_size", [("fp", 32), *FORMATS])
@pytest.mark.slow
def test_fused_projections_change_no_logit(tiny, weights, group_size, dtype):
    """q/k/v and gate/up fused into one GEMM each give the separate layers' logits bitwise (int8, int4) or, for
    eager float GEMMs, the same tokens; the memo serves each part once per input and recomputes otherwise."""
    cast = with_dtype(tiny, dtype)
    if weights == "fp":
        fused, apart = fuse_projections(cast.model), cast.model
    else:
        fused = with_dtype(with_weights(tiny, weights, group_size), dtype).model
        apart = with_dtype(with_weights(tiny, weights, group_size, fuse=False), dtype).model
    ids = torch.arange(40, 80)[None]
    with torch.inference_mode():
        a, b = fused(input_ids=ids).logits, apart(input_ids=ids).logits
    if weights == "fp":
        assert torch.equal(a.argmax(-1), b.argmax(-1)) and torch.allclose(a.float(), b.float(), atol=1e-2)
    else:
        assert torch.equal(a, b)
    for text in TEXTS:
        prompt = tiny.tokenizer(text)["input_ids"]
        assert _decode(fused, PlainDrafter(), tiny, prompt).tokens == \
            _decode(apart, PlainDrafter(), tiny, prompt).tokens


def test_a_fused_part_recomputes_for_another_input_or_one_changed_in_place(tiny):
    """The memo only saves work: a part called first, on another tensor, on a tensor changed in place (outside
    inference mode, where tensors count their versions) or a second time gets the separate layer's output."""
    attn = fuse_projections(tiny.model).model.layers[0].self_attn
    ref = tiny.model.model.layers[0].self_attn
    x, y = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    with torch.no_grad():
        assert torch.allclose(attn.k_proj(x), ref.k_proj(x), atol=1e-6)  # k first: no memo yet
        assert torch.allclose(attn.q_proj(x), ref.q_proj(x), atol=1e-6)
        assert torch.allclose(attn.v_proj(y), ref.v_proj(y), atol=1e-6)  # another tensor: computed afresh
        assert torch.allclose(attn.q_proj(y), ref.q_proj(y), atol=1e-6)
        y.mul_(2)  # same tensor, changed in place: its version counter moved
        assert torch.allclose(attn.k_proj(y), ref.k_proj(y), atol=1e-6)
    with torch.inference_mode():
        z = torch.randn(1, 3, 64)
        for name in ("q_proj", "k_proj", "v_proj", "k_proj"):  # k twice: the memo went once each part read it
            assert torch.allclose(getattr(attn, name)(z), getattr(ref, name)(z), atol=1e-6)
        assert attn.q_proj.fused._memo is not None  # the second k left a fresh memo for the other parts


@pytest.mark.parametrize("bad,match", [
    (("int3", 32), "model.weights='int3' is unknown; valid choices: fp, int8, int4"),
    (("int4", 48), "model.group_size=48 is invalid for int4 weights: give one of 32, 64, 128, 256"),
    (("int4", True), "model.group_size=True is invalid"),
])
def test_bad_weights_settings_are_one_error_line(bad, match):
    with pytest.raises(SpecbenchError, match=match):
        check_weights(*bad)


def test_a_group_size_that_does_not_divide_a_layer_names_the_ones_that_do(tiny):
    with pytest.raises(SpecbenchError, match="model.group_size=128 does not divide a linear's 64 input channels; "
                                             "give one of 32, 64"):
        with_weights(tiny, "int4", 128)


def test_a_quantised_target_is_refused_a_second_format_or_a_prepacked_base(tiny):
    from specbench.execution.backends import with_backend

    with pytest.raises(SpecbenchError, match="quantise the eager float model to int4; this one is int8"):
        with_weights(with_weights(tiny, "int8"), "int4")
    with pytest.raises(SpecbenchError, match="on backend 'prepacked'"):
        with_weights(with_backend(tiny, "prepacked"), "int8")


@pytest.mark.parametrize("override,match", [
    ("model.weights=int3", "model.weights='int3' is unknown; valid choices: fp, int8, int4, w8a8, w4a8, w4a8r, w8a8s, "
                           "auto"),
    ("model.group_size=100", "model.group_size=100 is invalid for int4 weights: give one of 32, 64, 128, 256"),
    ("eval.profile_weights=[fp,int2]", "eval.profile_weights"),
    ("eval.plain_executions=[eager/bfloat16/int5]", "eval.plain_executions entry 'eager/bfloat16/int5' is invalid"),
    ("eval.plain_executions=[fast/float32]", "eval.plain_executions entry 'fast/float32' is invalid"),
])
def test_bad_quantisation_settings_are_refused_before_anything_loads(override, match, tmp_path):
    from specbench.schema import validate
    from tests.conftest import compose_cfg

    with pytest.raises(SpecbenchError, match=match):
        validate(compose_cfg(["model=tiny_random", override], tmp_path))


def test_auto_runs_the_quantised_target_the_profile_finds_cheapest_and_judges_it_against_the_fastest_plain_decoding(
        tmp_path, monkeypatch):
    """A hand-made profile where int8 weights (fp32 activations, so losslessness is checked in fp32) verify cheapest
    and int4 decodes one token cheapest: the run decodes on int8, adds int4 plain decoding as the fastest, and one
    more plain decoding from eval.plain_executions; every method is lossless against int8's own plain decoding."""
    import pandas as pd

    from specbench.hardware.measured.machine import machine_info
    from specbench.hardware.measured.machine_profile import MachineProfile, profile_path
    from specbench.tasks import eval as eval_task
    from tests.conftest import compose_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    cost = {("eager", "float32", "fp"): lambda n: 50 + 5 * n, ("eager", "float32", "int8"): lambda n: 30 + 1 * n,
            ("eager", "float32", "int4_g32"): lambda n: 20 + 5 * n}
    cost |= {("eager", "bfloat16", w): lambda n: 500 + n for w in ("fp", "int8", "int4_g32")}  # never chosen
    rows = [{"backend": b, "dtype": d, "weights": w, "context": c, "tokens": n, "ms": float(f(n))}
            for (b, d, w), f in cost.items() for c in (128, 256, 1024) for n in (1, 2, 4, 8, 16, 32, 64)]
    peaks = {"peak_tflops": {"float32": 0.1}, "mem_bandwidth_gbs": 10.0, "layer_overhead_ms": 0.1, "memory_gb": 8.0}
    profile = MachineProfile(machine_info(), "cpu", "tiny_random", peaks, pd.DataFrame(rows))
    profile_path("tiny_random", "cpu").parent.mkdir(parents=True)
    profile_path("tiny_random", "cpu").write_text(profile.to_json())
    overrides = ["model=tiny_random", "model.backend=eager", "eval.dtype=float32", "model.weights=auto",
                 "eval.fastest_plain=true", "eval.profile_backends=[eager]", "eval.profile_weights=[fp,int8,int4]",
                 "eval.plain_executions=[eager/float32]", "eval.num_prompts=2", "eval.max_new_tokens=16",
                 "eval.profile_context=8",  # short prompts: int4's cheaper one-token step wins the answer
                 "eval.warmup=0", "eval.memory_probe=false", "eval.first_turn_only=true"]
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run")).set_index("method")
    assert list(summary.index) == ["plain", "plain@int4_g32", "plain@eager/float32",
                                   "pld"]
    assert summary.loc["pld", "weights"] == "int8" and summary.loc["plain", "weights"] == "int8"
    assert summary.loc["plain@int4_g32", "weights"] == "int4_g32"
    assert summary.loc["plain@eager/float32", "weights"] == "fp"
    assert summary.loc["pld", "fastest_plain"] in ("plain", "plain@int4_g32",
                                                "plain@eager/float32")  # the fastest measured here
    assert summary.loc["pld", "lossless_match"] == 1.0  # against int8's own plain decoding
