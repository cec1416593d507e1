"""vLLM's speculators format: an EAGLE-3 folder in its layout (written here from a tiny head, key by key as
speculators 0.9's Eagle3DraftModel names them) drafts what speculators' forward computes, restated below, and what
the same weights draft as specbench's own head; a head trained here exports to it and reads back drafting the same;
the speculators package (when installed) parses the export; a verifier other than the target is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specbench.drafters.eagle import EagleDrafter
from specbench.errors import SpecbenchError
from specbench.models.artifact import save_artifact
from specbench.models.published import save_speculators
from specbench.models.tiny import tiny_random
from specbench.tasks import dispatch
from specbench.training.eagle import EagleModule
from specbench.trees.dynamic import DynamicPolicy

from .conftest import compose_cfg
from .test_draft_model import lively_tiny
from .test_published import (PROMPT, Recording, assert_lossless, attention, eagle3_folder, first_proposal, mlp,
                             reference_chain, rms, target_states, write)

DRAFT_IDS = torch.randperm(64, generator=torch.Generator().manual_seed(4))[:40].tolist()  # unsorted on purpose
PROMPTS = [PROMPT, [60, 2, 2, 9, 33, 47]]


@pytest.fixture(scope="module")
def target():
    """EAGLE-3 fuses the inputs of layers 2, L//2 and L-3: three distinct layers need L >= 7."""
    return lively_tiny(num_layers=8)


def layer_config(target, layers: int = 1) -> dict:
    """transformer_layer_config as speculators writes it (to_diff_dict: a llama config's non-default keys)."""
    cfg = target.model.config
    return {"model_type": "llama", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": layers,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512}


def speculators_folder(folder: Path, target, state: dict, verifier: str = "tiny_random", **fields) -> Path:
    """SafeAILab's EAGLE-3 state (midlayer.*) renamed as speculators' Eagle3DraftModel saves it (layers.0.*)."""
    tensors = {("layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k): v
               for k, v in state.items()}
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "speculators_version": "0.9.0",
              "speculators_config": {"algorithm": "eagle3",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "default_proposal_method": "greedy",
                                     "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}},
              "transformer_layer_config": layer_config(target), "draft_vocab_size": len(DRAFT_IDS),
              "eagle_aux_hidden_state_layer_ids": [2, 4, 5], **fields}
    return write(folder, config, "model.safetensors", tensors)


def speculators_rows(sd, cfg, features, tokens, norm_before_residual: bool, norm_output: bool):
    """Eagle3FirstLayerMixin.forward (model_definitions.py) and Eagle3DraftModel.forward's norm (core.py): the
    residual is the feature, or its norm under norm_before_residual; under norm_output the normed output is what the
    next step reads."""
    eps, p = cfg["rms_norm_eps"], "layers.0."
    feature = rms(features, sd[p + "hidden_norm.weight"], eps)
    x = torch.cat([rms(sd["embed_tokens.weight"][tokens], sd[p + "input_layernorm.weight"], eps), feature], -1)
    h = (feature if norm_before_residual else features) + attention(x, sd, p + "self_attn.", cfg)
    h = h + mlp(rms(h, sd[p + "post_attention_layernorm.weight"], eps), sd, p + "mlp.")
    return rms(h, sd["norm.weight"], eps) if norm_output else h


def recorded_trees(drafter, target, prompts=PROMPTS, n=24) -> list[list[int]]:
    """Every tree the drafter proposes while decoding the prompts (lossless: the decode equals plain decoding)."""
    trees, propose = [], drafter.propose

    def spy(state):
        tree = propose(state)
        trees.append(tree.tokens.tolist())
        return tree

    drafter.propose = spy
    assert_lossless(target, drafter, prompts)
    del drafter.propose
    return trees


@pytest.mark.parametrize("norm_before_residual,norm_output", [(False, False), (True, True)],
                         ids=["eagle3", "norm_before_residual+norm_output"])
@pytest.mark.slow
def test_a_speculators_folder_drafts_what_speculators_computes_and_specbench_heads_draft(
        tmp_path, target, norm_before_residual, norm_output):
    published, config, state = eagle3_folder(tmp_path / "safeailab", target, DRAFT_IDS, "model.safetensors")
    folder = speculators_folder(tmp_path / "speculators", target, state, norm_before_residual=norm_before_residual,
                                norm_output=norm_output)
    policy = Recording(budget=4)
    drafter = EagleDrafter(target, policy, checkpoint=str(folder))
    assert drafter.needs_hidden_states == (2, 4, 5)
    tree, _, _, root = first_proposal(drafter, target)
    hidden, first = target_states(target)
    fused = torch.cat([hidden[2], hidden[4], hidden[5]], -1)[0] @ state["fc.weight"].T
    ids = torch.arange(len(DRAFT_IDS)) + state["d2t"]
    sd = {("layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k): v for k, v in state.items()}

    def logits_of(h):  # the draft vocabulary's logits at their target ids
        full = torch.full((64,), float("-inf"))
        full[ids] = (h if norm_output else rms(h, sd["norm.weight"], 1e-6)) @ sd["lm_head.weight"].T
        return full

    with torch.no_grad():
        chain, probs = reference_chain(
            lambda f, t: speculators_rows(sd, config, f, t, norm_before_residual, norm_output), logits_of, fused,
            PROMPT[1:] + [first], depth=3)
    assert root == first and tree.tokens.tolist() == [root] + chain
    torch.testing.assert_close(torch.stack(policy.rows), probs, atol=1e-5, rtol=1e-4)

    # the same weights as specbench's own head (an artifact of the trained layout) draft the same trees
    own = EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder))
    artifact = save_artifact(tmp_path / "own.safetensors", "eagle", target,
                             {"layout": "eagle3", "feature_layers": [2, 4, 5], "draft_vocab": len(DRAFT_IDS),
                              "config": config, "norm_before_residual": norm_before_residual,
                              "norm_output": norm_output},
                             own.head.state_dict() | {"d2t": own.d2t})
    trees = recorded_trees(EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), str(artifact)), target)
    assert recorded_trees(own, target) == trees and any(len(t) > 1 for t in trees)
    if not (norm_before_residual or norm_output):  # SafeAILab's layout of these weights: the same head
        assert recorded_trees(EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), str(published)),
                              target) == trees


def test_specforge_layout_loads_as_eagle3(tmp_path, target):
    """SpecForge writes SafeAILab's keys (midlayer.*, bool t2d) under a LlamaForCausalLMEagle3 config that may state
    target_hidden_size."""
    folder, config, _ = eagle3_folder(tmp_path / "specforge", target, DRAFT_IDS, "model.safetensors")
    config |= {"architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": 64}
    (folder / "config.json").write_text(json.dumps(config))
    drafter = EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), checkpoint=str(folder))
    assert sorted(drafter.d2t.tolist()) == sorted(DRAFT_IDS)
    assert_lossless(target, drafter)


def trained_eagle3_artifact(path: Path, target) -> Path:
    """An eagle3 head as task=train method.head=eagle3 writes it (EagleModule's arch and tensors), with random
    weights and an unsorted draft vocabulary."""
    torch.manual_seed(2)
    module = EagleModule(target.model, draft_vocab=len(DRAFT_IDS), export_dtype="float32", head="eagle3")
    for p in module.head.parameters():
        torch.nn.init.normal_(p, std=1.5 / 64 ** 0.5 if p.ndim > 1 else 1.0)
    module._use_vocabulary(torch.tensor(DRAFT_IDS))
    return save_artifact(path, "eagle", target, module.arch(), module.export_tensors())


def export(tmp_path: Path, artifact: Path, out: Path, *extra: str):
    cfg = compose_cfg(["task=export", "method=eagle", "model=tiny_random", "model.num_layers=8",
                       f"method.checkpoint={artifact}", f"export.out={out}", "export.dtype=float32", *extra], tmp_path)
    return dispatch(cfg)


def test_a_head_trained_here_exports_and_reads_back_drafting_the_same(tmp_path):
    target = tiny_random(num_layers=8)  # what model=tiny_random model.num_layers=8 builds
    artifact = trained_eagle3_artifact(tmp_path / "eagle.safetensors", target)
    out = export(tmp_path, artifact, tmp_path / "speculators")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["speculators_version"] == "0.9.0"
    assert config["speculators_config"]["verifier"] == {"name_or_path": "tiny_random",
                                                        "architectures": ["LlamaForCausalLM"]}
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and config["draft_vocab_size"] == len(DRAFT_IDS)
    tensors = load_file(str(out / "model.safetensors"))
    targets = torch.arange(len(DRAFT_IDS)) + tensors["d2t"]
    assert targets.tolist() == sorted(DRAFT_IDS) and tensors["t2d"].sum() == len(DRAFT_IDS)
    assert {"fc.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight"} <= set(tensors)
    tree = DynamicPolicy(budget=8, top_k=2, depth=3)
    trees = recorded_trees(EagleDrafter(target, tree, str(artifact)), target)
    assert recorded_trees(EagleDrafter(target, tree, str(out)), target) == trees and any(len(t) > 1 for t in trees)


def test_speculators_parses_the_export(tmp_path):
    eagle3 = pytest.importorskip("speculators.models.eagle3")
    target = tiny_random(num_layers=8)
    out = export(tmp_path, trained_eagle3_artifact(tmp_path / "eagle.safetensors", target), tmp_path / "out")
    config = eagle3.Eagle3SpeculatorConfig.from_pretrained(str(out))
    assert config.speculators_config.verifier.name_or_path == "tiny_random"
    assert config.draft_vocab_size == len(DRAFT_IDS) and config.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
    assert config.transformer_layer_config.hidden_size == 64 and config.target_vocab_size == 259  # bytes + 3
    config.transformer_layer_config._attn_implementation = "eager"  # its default, flex attention, wants a GPU
    model = eagle3.Eagle3DraftModel(config).eval()
    loaded = model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert not loaded.unexpected_keys and set(loaded.missing_keys) <= {"verifier_norm.weight", "verifier_lm_head.weight"}
    ids = torch.tensor([PROMPT])  # row t reads the target's features at t and token t+1, in speculators and here
    with torch.no_grad():
        hidden = target.model(ids, output_hidden_states=True).hidden_states
        features = torch.cat([hidden[i] for i in (2, 4, 5)], -1)[:, :-1]
        theirs = model(features, ids[:, 1:], document_ids=torch.zeros_like(ids[:, 1:]), ttt_steps=1)[0][0]
        head = EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3), str(out)).head
        ours = head.lm_head(head(head.fuse(features), target.model.get_input_embeddings()(ids[:, 1:])))[0].argmax(-1)
    assert (theirs + model.d2t[theirs]).tolist() == head.d2t[ours].tolist()


def test_a_verifier_other_than_the_target_is_one_error_line(tmp_path, target):
    _, _, state = eagle3_folder(tmp_path / "s", target, DRAFT_IDS, "model.safetensors")
    tree = DynamicPolicy(budget=8, top_k=2, depth=3)
    cases = [(speculators_folder(tmp_path / "name", target, state, verifier="meta-llama/Llama-3.1-8B-Instruct"),
              target, "trained for base model 'meta-llama/Llama-3.1-8B-Instruct' .*speculators_config.verifier"),
             (speculators_folder(tmp_path / "size", target, state), tiny_random(hidden_size=32, vocab_size=64),
              "built for verifier 'tiny_random' with hidden size 64 .* has 32 and 64"),
             (speculators_folder(tmp_path / "arch", target, state, speculators_config={
                 "algorithm": "eagle3", "proposal_methods": [], "default_proposal_method": "greedy",
                 "verifier": {"name_or_path": "tiny_random", "architectures": ["Qwen3ForCausalLM"]}}),
              target, "built for a Qwen3ForCausalLM verifier .* is a LlamaForCausalLM"),
             (speculators_folder(tmp_path / "mtp", target, state, speculators_model_type="mtp"), target,
              "speculators 'mtp' model; method=eagle reads its 'eagle3' heads only")]
    for folder, model, message in cases:
        with pytest.raises(SpecbenchError, match=message) as err:
            EagleDrafter(model, tree, checkpoint=str(folder))
        assert "\n" not in str(err.value)


def test_what_has_no_speculators_form_is_one_error_line(tmp_path, target):
    from .test_eagle import eagle_artifact

    fc_first = EagleDrafter(target, DynamicPolicy(budget=8, top_k=2, depth=3),
                            str(eagle_artifact(tmp_path / "own.safetensors", target))).head
    with pytest.raises(SpecbenchError, match="specbench's own EAGLE head .* method.head=eagle3"):
        save_speculators(tmp_path / "out", fc_first, target, "tiny_random")
    with pytest.raises(SpecbenchError, match="export.out is not set"):
        dispatch(compose_cfg(["task=export", "method=eagle", "model=tiny_random"], tmp_path))
    with pytest.raises(SpecbenchError, match="not method=medusa"):
        dispatch(compose_cfg(["task=export", "method=medusa", "model=tiny_random", "export.out=x"], tmp_path))


def test_an_export_never_replaces_the_checkpoint_it_reads_nor_another_folders_files(tmp_path):
    """export.out the folder method.checkpoint reads (a float32 export converted to bfloat16 in place), or a folder
    holding a Medusa checkpoint: one line before the model loads, every file as it was; an earlier export is replaced."""
    from .conftest import random_medusa_artifact

    target = tiny_random(num_layers=8)
    out = export(tmp_path, trained_eagle3_artifact(tmp_path / "eagle.safetensors", target), tmp_path / "fp32")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SpecbenchError, match=r"holds method.checkpoint=.* the head being exported, which the export "
                                             r"would replace: give export.out a new or empty folder"):
        export(tmp_path, out, out, "export.dtype=bfloat16")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    medusa = tmp_path / "medusa"
    random_medusa_artifact(medusa / "medusa.safetensors", target, [[0.5]] * 3)
    (medusa / "config.json").write_text('{"medusa_num_heads": 3}')
    kept = {p.name: p.read_bytes() for p in medusa.iterdir()}
    with pytest.raises(SpecbenchError, match=r"already holds config.json, medusa.json, medusa.safetensors, which an "
                                             r"export .* would replace or mix with"):
        export(tmp_path, out, medusa)
    assert {p.name: p.read_bytes() for p in medusa.iterdir()} == kept
    again = export(tmp_path, out, tmp_path / "copy")  # an earlier export's folder is replaced
    assert export(tmp_path, out, again, "export.dtype=bfloat16") == again
    assert load_file(str(again / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16
