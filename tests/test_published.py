"""Checkpoints in the seeds' published layouts: each built small (random weights, the published key names and config)
for a tiny target, loaded through method.checkpoint, and checked to draft exactly what the published architecture's
forward computes, restated compactly below from the repository's source; then decoded losslessly. Wrong layouts,
another base model and unsafe pickles are one error line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.eagle import EagleDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.ppd import PPDDrafter
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter
from specbench.models.tiny import tiny_random
from specbench.sampling import SamplingParams
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.native import NativePolicy
from specbench.trees.static import StaticPolicy

from .conftest import compose_cfg
from .test_draft_model import lively_tiny

PROMPT = [3, 17, 42, 8, 8, 30, 1, 12, 5]
STATIC = StaticPolicy(choices=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
ACCURACY = [[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]]


def write(folder: Path, config: dict, name: str, state: dict, config_name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / config_name).write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in state.items()}
    torch.save(state, folder / name) if name.endswith((".pt", ".bin")) else save_file(state, str(folder / name))
    return folder


def randomise(state: dict, seed: int, std: float = 0.3) -> dict:
    torch.manual_seed(seed)
    return {k: torch.randn_like(v) * (std / v.shape[-1] ** 0.5 if v.ndim > 1 else 1.0) if v.is_floating_point() else v
            for k, v in state.items()}


def first_proposal(drafter, target, prompt=PROMPT):
    """The first tree the drafter proposes in the decode loop, and its `_probs` when it proposed."""
    seen, propose = [], drafter.propose

    def spy(state):
        before = getattr(drafter, "_probs", None)
        tree = propose(state)
        seen.append((tree, before, getattr(drafter, "_probs", None), state.tokens[-1]))
        return tree

    drafter.propose = spy
    Decoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 2).generate(prompt)
    del drafter.propose
    return seen[0]


def assert_lossless(target, drafter, prompts=(PROMPT, [60, 2, 2, 9, 33, 47])):
    for prompt in prompts:
        want = Decoder(target.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 30).generate(prompt)
        got = Decoder(target.model, drafter, ExactAcceptance(), SamplingParams(), 30).generate(prompt)
        assert got.tokens == want.tokens


def target_states(target, prompt=PROMPT):
    with torch.no_grad():
        out = target.model(torch.tensor([prompt]), output_hidden_states=True)
    return out.hidden_states, int(out.logits[0, -1].argmax())


# ---- Medusa: FasterDecoding/Medusa, medusa/model/medusa_model.py (ResBlock, MedusaModel.medusa_head) ----------------

class OriginalResBlock(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + F.silu(self.linear(x))


def original_medusa_head(d: int, vocab: int, heads: int, layers: int) -> torch.nn.ModuleList:
    """The published head list, with its quirk: one ResBlock repeated `layers` times (shared weights)."""
    return torch.nn.ModuleList(torch.nn.Sequential(*([OriginalResBlock(d)] * layers), torch.nn.Linear(d, vocab, bias=False))
                               for _ in range(heads))


@pytest.fixture(scope="module")
def target():
    return lively_tiny()


def medusa_folder(folder: Path, target, layers: int, name: str, heads: int = 3, stated: int | None = None):
    cfg = target.model.config
    module = original_medusa_head(cfg.hidden_size, cfg.vocab_size, heads, layers)
    torch.manual_seed(layers)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.5 / cfg.hidden_size ** 0.5)
    config = {"medusa_num_heads": stated or heads, "medusa_num_layers": layers,
              "base_model_name_or_path": target.name}
    state = module.state_dict()
    if name == "model.safetensors":  # Medusa-2: the whole tuned model, the heads under medusa_head.
        state = {f"medusa_head.{k}": v.clone() for k, v in state.items()} | {
            k: v.clone() for k, v in target.model.state_dict().items()}  # a tied LM head: stored once per key
        config |= target.model.config.to_dict()
    elif name.endswith(".safetensors"):
        state = {k: v.clone() for k, v in state.items()}  # safetensors stores each (shared) tensor once per key
    return write(folder, config, name, state), module


@pytest.mark.parametrize("layers,name", [(1, "medusa_lm_head.safetensors"), (2, "medusa_lm_head.pt"),
                                         (1, "model.safetensors")], ids=["medusa-1 safetensors", "shared blocks .pt",
                                                                         "medusa-2 model"])
def test_medusa_heads_draft_what_fasterdecoding_computes(tmp_path, target, layers, name):
    folder, original = medusa_folder(tmp_path / "medusa", target, layers, name)
    drafter = MedusaDrafter(target, STATIC, checkpoint=str(folder))
    tree, _, probs, root = first_proposal(drafter, target)
    hidden, first = target_states(target)
    with torch.no_grad():
        want = torch.stack([head(hidden[-1][0, -1]) for head in original]).softmax(-1)
    torch.testing.assert_close(probs, want, atol=1e-5, rtol=1e-4)
    top = want.topk(3, dim=-1).indices.tolist()  # head k's ranks: candidates k+1 tokens after the root
    assert root == first
    assert tree.tokens.tolist() == [root, top[0][0], top[0][1], top[0][2], top[1][0], top[1][1], top[1][0],
                                    top[2][0]]
    assert_lossless(target, drafter)


def test_medusa_uses_the_heads_its_weights_hold(tmp_path, target):
    """FasterDecoding's own loader overrides an uploaded config's head count; so does ours, from the weights."""
    folder, _ = medusa_folder(tmp_path / "m", target, 1, "medusa_lm_head.pt", heads=3, stated=2)
    assert MedusaDrafter(target, STATIC, checkpoint=str(folder / "medusa_lm_head.pt")).num_heads == 3


def test_medusa_config_builds_from_a_published_folder(tmp_path, tiny):
    folder, _ = medusa_folder(tmp_path / "m", tiny, 1, "medusa_lm_head.safetensors")
    cfg = compose_cfg(["method=medusa", "model=tiny_random", f"method.checkpoint={folder}",
                       "tree.accept_prob=medusa_vicuna_7b_accuracies", "tree.budget=8"], tmp_path)
    drafter = build_drafter(cfg.method.drafter, tiny, GreedyPolicy(8, "medusa_vicuna_7b_accuracies"))
    assert drafter.num_heads == 3 and drafter.heads.proj is not None
    with pytest.raises(SpecbenchError, match="carries no per-head accuracies.*tree.accept_prob"):
        MedusaDrafter(tiny, GreedyPolicy(8, accept_prob=None), checkpoint=str(folder))


# ---- EAGLE-1: SafeAILab/EAGLE, eagle/model/cnets1.py (Model.forward, LlamaDecoderLayer with index 0) ----------------
# ---- EAGLE-3: SafeAILab/EAGLE, eagle/model/cnets.py (Model.forward, LlamaDecoderLayeremb, topK_genrate) -------------

def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, theta):
    """Rotary embedding of (rows, heads, head_dim) at positions 0..rows-1 (LlamaRotaryEmbedding, rotate_half)."""
    half = x.shape[-1] // 2
    freqs = torch.arange(x.shape[0])[:, None].float() / theta ** (torch.arange(0, 2 * half, 2).float() / (2 * half))
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def attention(x, sd, prefix, cfg):
    """Causal multi-head attention with grouped key/value heads (LlamaAttention.forward there)."""
    n, heads, groups = x.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dim = cfg["hidden_size"] // heads
    q = rope((x @ sd[prefix + "q_proj.weight"].T).view(n, heads, dim), cfg["rope_theta"])
    k = rope((x @ sd[prefix + "k_proj.weight"].T).view(n, groups, dim), cfg["rope_theta"])
    v = (x @ sd[prefix + "v_proj.weight"].T).view(n, groups, dim)
    k, v = k.repeat_interleave(heads // groups, 1), v.repeat_interleave(heads // groups, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", scores, v).reshape(n, heads * dim) @ sd[prefix + "o_proj.weight"].T


def mlp(x, sd, prefix):
    return (F.silu(x @ sd[prefix + "gate_proj.weight"].T) * (x @ sd[prefix + "up_proj.weight"].T)) @ \
        sd[prefix + "down_proj.weight"].T


def eagle1_rows(sd, cfg, features, tokens):
    """cnets1.Model.forward: fc(cat(embedding, feature)), then the layers; layer 0 has no input norm."""
    h = torch.cat([sd["embed_tokens.weight"][tokens], features], -1) @ sd["fc.weight"].T + sd["fc.bias"]
    for i in range(cfg["num_hidden_layers"]):
        p, eps = f"layers.{i}.", cfg["rms_norm_eps"]
        x = h if i == 0 else rms(h, sd[p + "input_layernorm.weight"], eps)
        h = h + attention(x, sd, p + "self_attn.", cfg)
        h = h + mlp(rms(h, sd[p + "post_attention_layernorm.weight"], eps), sd, p + "mlp.")
    return h


def eagle3_rows(sd, cfg, features, tokens):
    """cnets.Model.forward with LlamaDecoderLayeremb: the attention reads cat(norm(embedding), norm(feature))."""
    eps, p = cfg["rms_norm_eps"], "midlayer."
    x = torch.cat([rms(sd["embed_tokens.weight"][tokens], sd[p + "input_layernorm.weight"], eps),
                   rms(features, sd[p + "hidden_norm.weight"], eps)], -1)
    h = features + attention(x, sd, p + "self_attn.", cfg)
    return h + mlp(rms(h, sd[p + "post_attention_layernorm.weight"], eps), sd, p + "mlp.")


def reference_chain(rows, logits_of, features, tokens, depth):
    """topK_genrate's top-1 path, recomputed from scratch at each depth: the draft row's own output is the next
    row's feature (EAGLE-3: before the norm)."""
    probs, chain = [], []
    for _ in range(depth):
        out = rows(features, torch.tensor(tokens))
        p = logits_of(out[-1]).softmax(-1)
        chain.append(int(p.argmax()))
        probs.append(p)
        features, tokens = torch.cat([features, out[-1:]]), tokens + [chain[-1]]
    return chain, torch.stack(probs)


class Recording(ChainPolicy):
    """A chain whose every expansion is recorded (the drafter's distributions over the target's vocabulary)."""

    def build(self, root, expander):
        self.rows = []
        recording = self

        class Spy:
            generator = None

            def expand(self, tree, nodes):
                probs = expander.expand(tree, nodes)
                recording.rows.append(probs[0].clone())
                return probs

        return super().build(root, Spy())


def eagle_config(cfg, layers: int, **extra) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.hidden_size,
            "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": layers,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": cfg.vocab_size, "hidden_act": "silu",
            "max_position_embeddings": 512, "bias": True, **extra}


def eagle1_state(cfg, cfg_json, embed) -> dict:
    d, inter = cfg.hidden_size, cfg_json["intermediate_size"]
    kv = d // cfg_json["num_attention_heads"] * cfg_json["num_key_value_heads"]
    state = {"embed_tokens.weight": embed.clone(), "fc.weight": torch.empty(d, 2 * d), "fc.bias": torch.empty(d)}
    for i in range(cfg_json["num_hidden_layers"]):
        p = f"layers.{i}."
        state |= {p + "self_attn.q_proj.weight": torch.empty(d, d), p + "self_attn.k_proj.weight": torch.empty(kv, d),
                  p + "self_attn.v_proj.weight": torch.empty(kv, d), p + "self_attn.o_proj.weight": torch.empty(d, d),
                  p + "mlp.gate_proj.weight": torch.empty(inter, d), p + "mlp.up_proj.weight": torch.empty(inter, d),
                  p + "mlp.down_proj.weight": torch.empty(d, inter), p + "post_attention_layernorm.weight": torch.empty(d)}
        if i:
            state[p + "input_layernorm.weight"] = torch.empty(d)
    state = randomise({k: v for k, v in state.items() if k != "embed_tokens.weight"}, seed=2)
    return state | {"embed_tokens.weight": embed.clone()}


def test_eagle1_head_drafts_what_cnets1_computes(tmp_path, target):
    cfg = target.model.config
    config = eagle_config(cfg, layers=2)
    state = eagle1_state(cfg, config, target.model.get_input_embeddings().weight.detach())
    folder = write(tmp_path / "eagle1", config, "pytorch_model.bin", state)
    policy = Recording(budget=4)
    drafter = EagleDrafter(target, policy, checkpoint=str(folder))
    tree, _, _, root = first_proposal(drafter, target)
    hidden, first = target_states(target)
    lm_head = target.model.get_output_embeddings().weight.detach()
    with torch.no_grad():
        chain, probs = reference_chain(lambda f, t: eagle1_rows(state, config, f, t), lambda h: h @ lm_head.T,
                                       hidden[-1][0], PROMPT[1:] + [first], depth=3)
    assert root == first and tree.tokens.tolist() == [root] + chain
    torch.testing.assert_close(torch.stack(policy.rows), probs, atol=1e-5, rtol=1e-4)
    assert drafter.parameters_bytes()[0] == sum(v.numel() for k, v in state.items() if k != "embed_tokens.weight")
    assert_lossless(target, EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder)))


@pytest.fixture(scope="module")
def deep_target():
    """EAGLE-3 fuses the inputs of layers 2, L//2 and L-3: three distinct layers need L >= 7."""
    return lively_tiny(num_layers=8)


def eagle3_folder(folder: Path, target, draft_ids: list[int], name: str = "pytorch_model.bin", embed: bool = True):
    cfg = target.model.config
    d, vocab = cfg.hidden_size, cfg.vocab_size
    config = eagle_config(cfg, layers=1, draft_vocab_size=len(draft_ids))
    kv = d // 4 * 2
    p = "midlayer."
    state = randomise({"fc.weight": torch.empty(d, 3 * d), p + "self_attn.q_proj.weight": torch.empty(d, 2 * d),
                       p + "self_attn.k_proj.weight": torch.empty(kv, 2 * d),
                       p + "self_attn.v_proj.weight": torch.empty(kv, 2 * d),
                       p + "self_attn.o_proj.weight": torch.empty(d, d),
                       p + "mlp.gate_proj.weight": torch.empty(96, d), p + "mlp.up_proj.weight": torch.empty(96, d),
                       p + "mlp.down_proj.weight": torch.empty(d, 96), p + "hidden_norm.weight": torch.empty(d),
                       p + "input_layernorm.weight": torch.empty(d), p + "post_attention_layernorm.weight": torch.empty(d),
                       "norm.weight": torch.empty(d), "lm_head.weight": torch.empty(len(draft_ids), d)}, seed=3, std=1.5)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    state |= {"d2t": torch.tensor(draft_ids) - torch.arange(len(draft_ids)), "t2d": t2d}
    if embed:
        state["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    return write(folder, config, name, state), config, state


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.safetensors"])
def test_eagle3_head_drafts_what_cnets_computes(tmp_path, deep_target, name):
    target = deep_target
    draft_ids = sorted(torch.randperm(64, generator=torch.Generator().manual_seed(4))[:40].tolist())
    folder, config, state = eagle3_folder(tmp_path / "eagle3", target, draft_ids, name)
    policy = Recording(budget=4)
    drafter = EagleDrafter(target, policy, checkpoint=str(folder))
    assert drafter.needs_hidden_states == (2, 4, 5)
    tree, _, _, root = first_proposal(drafter, target)
    hidden, first = target_states(target)
    fused = torch.cat([hidden[2], hidden[4], hidden[5]], -1)[0] @ state["fc.weight"].T
    ids = torch.arange(40) + state["d2t"]

    def logits_of(h):  # the draft vocabulary's logits placed at their target ids, -inf elsewhere
        full = torch.full((64,), float("-inf"))
        full[ids] = rms(h, state["norm.weight"], 1e-6) @ state["lm_head.weight"].T
        return full

    with torch.no_grad():
        chain, probs = reference_chain(lambda f, t: eagle3_rows(state, config, f, t), logits_of, fused,
                                       PROMPT[1:] + [first], depth=3)
    assert root == first and tree.tokens.tolist() == [root] + chain
    assert set(chain) <= set(draft_ids)
    torch.testing.assert_close(torch.stack(policy.rows), probs, atol=1e-5, rtol=1e-4)
    assert_lossless(target, EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder)))


def test_eagle_checkpoints_of_another_base_model_are_refused(tmp_path, target, deep_target):
    other = torch.randn_like(target.model.get_input_embeddings().weight)
    config = eagle_config(target.model.config, layers=1)
    folder = write(tmp_path / "other", config, "pytorch_model.bin",
                   eagle1_state(target.model.config, config, other))
    with pytest.raises(SpecbenchError, match="token embedding of another base model"):
        EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder))
    with pytest.raises(SpecbenchError, match="hidden size 64 and vocabulary 64, but the target 'tiny_random' has 32"):
        EagleDrafter(tiny_random(hidden_size=32, vocab_size=64), DynamicPolicy(budget=8, top_k=2, depth=3),
                     checkpoint=str(folder))
    folder3, _, _ = eagle3_folder(tmp_path / "e3", deep_target, list(range(40)), embed=False)
    with pytest.raises(SpecbenchError, match="only 2 distinct layers of the 4-layer target"):
        EagleDrafter(lively_tiny(num_layers=4), DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder3))
    with pytest.raises(SpecbenchError, match="carries no per-position accuracies"):
        EagleDrafter(deep_target, GreedyPolicy(8, accept_prob=None), checkpoint=str(folder3))


# ---- PPD: hmarkc/parallel-prompt-decoding, prompt/model/model.py (PromptDecoder.forward, ensemble mask, mean) --------

def ppd_folder(folder: Path, target, m: int, members: int, **config) -> tuple[Path, torch.Tensor]:
    torch.manual_seed(6)
    embeds = torch.randn(m * members, target.model.config.hidden_size)
    adapter = {"peft_type": "PROMPT_TUNING", "num_special_tokens": m, "virtual_tokens_per_special_token": members,
               "num_virtual_tokens": m * members, "token_dim": target.model.config.hidden_size,
               "vt_attention_type": "ensemble", "aggregation_type": "mean", "use_custom_lm_head": False,
               "use_prefix_tuning": False, "num_exits": 1, "base_model_name_or_path": target.name, **config}
    return write(folder, adapter, "adapter_model.safetensors", {"prompt_embeddings": embeds},
                 "adapter_config.json"), embeds


def ppd_reference(target, prompt, embeds, m, members):
    """PromptDecoder.forward: the prompt tokens appended after the input, member j of special token i at position
    len + i seeing the input and member j of special tokens <= i (ensemble); logits averaged over members."""
    n, rows = len(prompt), m * members
    inputs = torch.cat([target.model.get_input_embeddings()(torch.tensor(prompt)), embeds])
    mask = torch.ones(n + rows, n + rows, dtype=torch.bool).tril()
    mask[n:, n:] = False
    for r in range(rows):
        i, j = divmod(r, members)
        for k in range(i + 1):
            mask[n + r, n + k * members + j] = True
    positions = torch.cat([torch.arange(n), n + torch.arange(m).repeat_interleave(members)])
    with torch.no_grad():
        logits = target.model(inputs_embeds=inputs[None], attention_mask=mask[None, None],
                              position_ids=positions[None]).logits[0]
    return logits[n:].view(m, members, -1).mean(1).softmax(-1)


@pytest.mark.parametrize("members", [1, 2])
def test_ppd_prompt_tokens_draft_what_the_ppd_repository_computes(tmp_path, target, members):
    folder, embeds = ppd_folder(tmp_path / f"ppd{members}", target, m=3, members=members)
    drafter = PPDDrafter(target, NativePolicy(budget=16), checkpoint=str(folder), accept_prob=ACCURACY)
    tree, probs, _, root = first_proposal(drafter, target)
    torch.testing.assert_close(probs, ppd_reference(target, PROMPT, embeds, 3, members), atol=1e-5, rtol=1e-4)
    assert int(tree.tokens[1]) == int(probs[0].argmax())  # the first candidate: prompt token 1's top guess
    assert_lossless(target, drafter)


def test_ppd_checkpoint_errors_are_one_line(tmp_path, target):
    folder, _ = ppd_folder(tmp_path / "p", target, m=3, members=1)
    with pytest.raises(SpecbenchError, match="carries none: give method.drafter.accept_prob"):
        PPDDrafter(target, NativePolicy(budget=16), checkpoint=str(folder))
    custom, _ = ppd_folder(tmp_path / "c", target, m=3, members=2, use_custom_lm_head=True,
                           vt_attention_type="decoder")
    with pytest.raises(SpecbenchError, match="use_custom_lm_head=True, vt_attention_type='decoder' with 2"):
        PPDDrafter(target, NativePolicy(budget=16), checkpoint=str(custom), accept_prob=ACCURACY)
    with pytest.raises(SpecbenchError, match=r"shape \(3, 64\).*need \(3, 32\)"):
        PPDDrafter(tiny_random(hidden_size=32, vocab_size=64), NativePolicy(budget=16), checkpoint=str(folder),
                   accept_prob=ACCURACY)


# ---- loading itself -------------------------------------------------------------------------------------------------

class NotATensor:
    pass


def test_layout_errors_are_one_line(tmp_path, target):
    medusa, _ = medusa_folder(tmp_path / "m", target, 1, "medusa_lm_head.pt")
    config = json.loads((medusa / "config.json").read_text())
    (medusa / "config.json").write_text(json.dumps(config | {"medusa_num_layers": 2}))
    with pytest.raises(SpecbenchError, match="does not match its config's medusa_num_layers=2"):
        MedusaDrafter(target, STATIC, checkpoint=str(medusa))
    with pytest.raises(SpecbenchError, match="hidden size 64 and vocabulary 64 .*'tiny_random'.* has 32 and 64"):
        (medusa / "config.json").write_text(json.dumps(config))
        MedusaDrafter(tiny_random(hidden_size=32, vocab_size=64), STATIC, checkpoint=str(medusa))
    with pytest.raises(SpecbenchError, match="published Medusa layout, not eagle's"):
        EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(medusa))
    unsafe = write(tmp_path / "unsafe", config, "medusa_lm_head.pt", {})
    torch.save({"0.0.linear.weight": NotATensor()}, unsafe / "medusa_lm_head.pt")
    with pytest.raises(SpecbenchError, match="could not be read safely"):
        MedusaDrafter(target, STATIC, checkpoint=str(unsafe))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(SpecbenchError, match="none of its weight files"):
        EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(empty))
    model_dir = write(tmp_path / "model", {"hidden_size": 64}, "model.safetensors", {"lm_head.weight": torch.ones(2)})
    with pytest.raises(SpecbenchError, match="no EAGLE draft weights"):
        EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(model_dir))


def test_hub_ids_resolve_from_the_local_cache_only(tmp_path, target, monkeypatch):
    """A hub id names its snapshot in the local Hugging Face cache; one not there is an error, never a download."""
    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--acme--medusa-tiny" / "snapshots" / "abc123"
    medusa_folder(snapshot, target, 1, "medusa_lm_head.safetensors")
    (tmp_path / "hub" / "models--acme--medusa-tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--medusa-tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert MedusaDrafter(target, STATIC, checkpoint="acme/medusa-tiny").num_heads == 3
    with pytest.raises(SpecbenchError, match="'acme/absent' does not exist.*runs never download"):
        MedusaDrafter(target, STATIC, checkpoint="acme/absent")


def test_vicuna_config_renders_fastchats_prompt(tmp_path, tiny):
    """conf/model/vicuna_7b.yaml's template is FastChat's vicuna_v1.1 (its tokenizer ships none), set on load."""
    from specbench.models.loading import load_model

    tiny.model.save_pretrained(tmp_path / "vicuna")
    tiny.tokenizer.save_pretrained(tmp_path / "vicuna")
    template = compose_cfg(["model=vicuna_7b"], tmp_path).model.chat_template
    loaded = load_model("vicuna_7b", str(tmp_path / "vicuna"), dtype="float32", chat_template=template)
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Why?"}]
    system = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
              "detailed, and polite answers to the user's questions.")
    assert loaded.chat_template is True
    assert loaded.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False) == \
        f"{tiny.tokenizer.bos_token}{system} USER: Hi? ASSISTANT: Hello.</s>USER: Why? ASSISTANT:"


def test_gpu_recipes_validate_with_the_users_paths(tmp_path, tiny):
    """docs/GPU.md's experiments compose and pass every setting check once the user's folders are given (their
    shipped defaults name hub ids this offline machine has not cached)."""
    from specbench.schema import validate

    config = tiny.model.config
    context, config.max_position_embeddings = config.max_position_embeddings, 4096  # Vicuna's room for 1,024 tokens
    try:
        tiny.model.save_pretrained(tmp_path / "vicuna")
    finally:
        config.max_position_embeddings = context
    tiny.tokenizer.save_pretrained(tmp_path / "vicuna")
    medusa, _ = medusa_folder(tmp_path / "medusa", tiny, 1, "medusa_lm_head.safetensors")
    questions = tmp_path / "question.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Why?"]}) + "\n")
    paths = [f"model.path={tmp_path / 'vicuna'}", f"checkpoints.medusa={medusa}"]
    validate(compose_cfg(["experiment=gpu/medusa1_vicuna7b", *paths], tmp_path))
    validate(compose_cfg(["experiment=gpu/spec_bench_vicuna7b", *paths, f"checkpoints.eagle={medusa}",
                          f"checkpoints.draft={tmp_path / 'vicuna'}", f"dataset.path={questions}"], tmp_path))
    with pytest.raises(SpecbenchError, match="Missing mandatory value: checkpoints.medusa"):
        validate(compose_cfg(["experiment=gpu/medusa1_vicuna7b", paths[0]], tmp_path))


def test_a_content_fingerprint_follows_the_content_not_the_name(tmp_path, monkeypatch):
    """A published folder changes its fingerprint when any file changes, a large shard included (read by its ends
    and size, not whole); an untouched copy elsewhere keeps it; a path with nothing is 'missing'."""
    import shutil

    from specbench.models.published import files

    monkeypatch.setattr(files, "FULL_HASH_BYTES", 3 << 20)  # the 4 MiB shard below counts as large
    folder = tmp_path / "medusa-published"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    shard = bytearray(4 << 20)
    (folder / "model.safetensors").write_bytes(shard)
    before = files.content_fingerprint(folder)
    shutil.copytree(folder, tmp_path / "copy")
    assert files.content_fingerprint(tmp_path / "copy") == before
    shard[-1] = 1  # the last MiB of a large file is read
    (folder / "model.safetensors").write_bytes(shard)
    assert files.content_fingerprint(folder) != before
    (tmp_path / "copy" / "config.json").write_text(json.dumps({"medusa_num_heads": 3}))
    assert files.content_fingerprint(tmp_path / "copy") != before
    assert files.content_fingerprint(tmp_path / "nothing.safetensors") == "missing"


# ---- a published folder that is not the run's: one line each, before decoding (issue 34) -----------------------------

def test_medusa_head_count_and_tree_depth_are_checked(tmp_path, target):
    folder, _ = medusa_folder(tmp_path / "m", target, 1, "medusa_lm_head.safetensors", heads=2)
    with pytest.raises(SpecbenchError, match=r"num_heads=4 is invalid: .*holds 2 heads, so give an integer in 1\.\.2"):
        MedusaDrafter(target, ChainPolicy(budget=3), checkpoint=str(folder), num_heads=4)
    assert MedusaDrafter(target, ChainPolicy(budget=3), checkpoint=str(folder), num_heads=1).num_heads == 1
    with pytest.raises(SpecbenchError, match="tree=static is 3 tokens deep, but .* drafts with 2 heads"):
        MedusaDrafter(target, STATIC, checkpoint=str(folder))
    stated, _ = medusa_folder(tmp_path / "s", target, 1, "medusa_lm_head.safetensors", heads=2, stated=4)
    with pytest.raises(SpecbenchError, match="states medusa_num_heads=4 .* weights hold 2 heads"):
        MedusaDrafter(target, ChainPolicy(budget=3), checkpoint=str(stated))


@pytest.mark.parametrize("kind", ["medusa", "ppd"])
def test_a_config_naming_another_base_model_is_refused(tmp_path, target, kind):
    """Shapes that fit are not enough: the config's base_model_name_or_path must name the target, by its last path
    part (a hub id, a local folder or a hub cache snapshot of it)."""
    if kind == "medusa":
        folder, _ = medusa_folder(tmp_path / "m", target, 1, "medusa_lm_head.safetensors")
        build = lambda: MedusaDrafter(target, ChainPolicy(budget=3), checkpoint=str(folder))  # noqa: E731
    else:
        folder, _ = ppd_folder(tmp_path / "p", target, m=3, members=1)
        build = lambda: PPDDrafter(target, NativePolicy(budget=16), checkpoint=str(folder),  # noqa: E731
                                   accept_prob=ACCURACY)
    name = "adapter_config.json" if kind == "ppd" else "config.json"
    config = json.loads((folder / name).read_text())
    for same in ("acme/TINY_RANDOM", "/models/tiny_random/", "/hub/models--acme--tiny_random/snapshots/abc"):
        (folder / name).write_text(json.dumps(config | {"base_model_name_or_path": same}))
        build()
    (folder / name).write_text(json.dumps(config | {"base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    with pytest.raises(SpecbenchError, match="trained for base model 'lmsys/vicuna-7b-v1.3' .* but the target is "
                                             "'tiny_random'"):
        build()


def test_a_medusa2_folder_must_be_the_target(tmp_path, target):
    folder, _ = medusa_folder(tmp_path / "m2", target, 1, "model.safetensors")
    other = lively_tiny(seed=5)
    with pytest.raises(SpecbenchError, match="is a Medusa-2 model .* its token embedding .* is not the target"):
        MedusaDrafter(other, ChainPolicy(budget=3), checkpoint=str(folder))


@pytest.mark.parametrize("damage,message", [
    ({"d2t": -1}, r"to target ids -1\.\.\d+ \(40 distinct\); each must be a distinct id in 0\.\.63"),
    ({"d2t": 100}, r"to target ids \d+\.\.\d+ \(40 distinct\); each must be a distinct id in 0\.\.63"),
    ({"d2t": "repeat"}, r"\(39 distinct\); each must be a distinct id"),
    ({"t2d": "all"}, "its t2d flags 64 target ids"),
    ({"t2d": "shifted"}, r"its t2d flags 40 target ids, 1 of d2t's 40 not among them"),
    ({"t2d": "short"}, r"its t2d has shape \(10,\)"),
])
def test_eagle3_vocabulary_maps_are_checked_both_ways(tmp_path, deep_target, damage, message):
    draft_ids = list(range(3, 43))
    folder, _, state = eagle3_folder(tmp_path / "e3", deep_target, draft_ids, "model.safetensors")
    d2t, t2d = state["d2t"].clone(), state["t2d"].clone()
    if "d2t" in damage:
        if damage["d2t"] == "repeat":
            d2t[1] = d2t[0] - 1  # draft ids 0 and 1 both map to target id 3
        else:
            d2t[0] = damage["d2t"]  # draft id 0 -> target id 0 + d2t[0]
    elif damage["t2d"] == "all":
        t2d[:] = True
    elif damage["t2d"] == "shifted":
        t2d[3], t2d[50] = False, True
    else:
        t2d = t2d[:10]
    save_file({k: v.contiguous() for k, v in (state | {"d2t": d2t, "t2d": t2d}).items()},
              str(folder / "model.safetensors"))
    with pytest.raises(SpecbenchError, match=message):
        EagleDrafter(deep_target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder))


def test_our_eagle_artifacts_d2t_is_checked(tmp_path, target):
    from specbench.drafters.eagle import check_d2t

    assert check_d2t(torch.tensor([0, 5, 63]), 64, "x").tolist() == [0, 5, 63]
    for bad in ([-1, 5], [0, 64], [3, 3], [[1]]):
        with pytest.raises(SpecbenchError, match="checkpoint 'x'"):
            check_d2t(torch.tensor(bad), 64, "x")
