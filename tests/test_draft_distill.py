"""Draft distillation: training lowers the draft's KL to the target, the exported artifact rebuilds the same draft
for method=draft_model, and decoding with it stays lossless (fp32 greedy)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.errors import SpecbenchError
from specbench.tasks.train import train
from specbench.training.draft_distill import DraftDistillModule
from specbench.trees.chain import ChainPolicy
from specbench.trees.dynamic import DynamicPolicy

from .conftest import compose_cfg
from .test_draft_model import PROMPTS, lively_tiny
from .test_training import SMALL


def test_distillation_lowers_the_drafts_kl_to_the_target():
    target = lively_tiny(seed=3)
    module = DraftDistillModule(target.model, num_layers=1)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 24))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids).bool()}
    trainable = [p for p in module.parameters() if p.requires_grad]
    assert trainable and all(p.requires_grad is False for p in target.model.parameters())
    before = module._kl(*module._logits(batch)).item()
    opt = torch.optim.Adam(trainable, lr=3e-3)
    for _ in range(30):
        loss = module._kl(*module._logits(batch))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = module._kl(*module._logits(batch)).item()
    assert after < 0.5 * before, (before, after)
    # the target itself did not move: only the draft's copies of layer 0 and the norm trained
    assert not torch.equal(module.draft.model.layers[0].mlp.up_proj.weight, target.model.model.layers[0].mlp.up_proj.weight)


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, tiny):
    run = tmp_path_factory.mktemp("distill")
    cfg = compose_cfg(["method=draft_model", "method.train.module.num_layers=1", "method.train.max_steps=3",
                       "method.train.module.export_dtype=float32", *SMALL], run)
    return train(cfg, run)


@pytest.mark.slow
def test_the_exported_draft_rebuilds_and_decodes_losslessly(tiny, distilled):
    drafter = DraftModelDrafter(tiny, DynamicPolicy(budget=7, top_k=2, depth=3),
                                early_exit_layers=None, checkpoint=distilled["artifact"])
    params, _ = drafter.parameters_bytes()
    layer = tiny.model.model.layers[0]
    assert params == sum(p.numel() for p in layer.parameters()) + tiny.model.model.norm.weight.numel()
    assert drafter.draft.model.model.layers[0] is not layer  # its own trained copy, loaded from the artifact
    accepted = 0
    for prompt in PROMPTS:
        want = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 24).generate(prompt)
        for tree in (ChainPolicy(budget=4), DynamicPolicy(budget=7, top_k=2, depth=3)):
            drafter.tree = tree
            got = Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), 24).generate(prompt)
            assert got.tokens == want.tokens
            accepted += sum(s.accepted for s in got.steps)
    assert accepted > 0  # drafts were accepted, so the cache rollback and commit paths ran


def test_a_distilled_draft_is_checked_and_not_combined_with_another(tiny, distilled, tmp_path):
    with pytest.raises(SpecbenchError, match=r"num_layers=2 is invalid.*1\.\.1"):
        DraftDistillModule(tiny.model, num_layers=2)
    with pytest.raises(SpecbenchError, match="two drafts"):
        DraftModelDrafter(tiny, ChainPolicy(), draft_model=tiny, checkpoint=distilled["artifact"])
    with pytest.raises(SpecbenchError, match="does not exist"):
        DraftModelDrafter(tiny, ChainPolicy(), checkpoint=str(tmp_path / "none.safetensors"))
    from safetensors.torch import load_file, save_file

    from specbench.models import tiny_random

    weights = load_file(distilled["artifact"])
    broken = tmp_path / "broken.safetensors"
    save_file({k: v for k, v in weights.items() if not k.startswith("norm.")}, str(broken))
    broken.with_suffix(".json").write_text(Path(distilled["artifact"]).with_suffix(".json").read_text())
    with pytest.raises(SpecbenchError, match="does not hold the distilled draft"):
        DraftModelDrafter(tiny, ChainPolicy(), checkpoint=str(broken))

    with pytest.raises(SpecbenchError, match="layer count"):
        DraftModelDrafter(tiny_random(num_layers=3), ChainPolicy(), checkpoint=distilled["artifact"])
