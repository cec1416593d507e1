"""Medusa heads: greedy exact acceptance reproduces plain decoding token for token (fp32), the heads read
the verify forward's hidden states, untied heads start as the LM head, and Medusa-2 follows the paper's recipe and
decodes with its own tuned backbone, losslessly against that backbone's plain decoding."""

import pytest
import torch

from specbench.acceptance.exact import ExactAcceptance
from specbench.config import build
from specbench.sampling import SamplingParams
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.errors import SpecbenchError
from specbench.models import tiny_random
from specbench.models.artifact import ADAPTER_PREFIX, load_artifact, save_artifact
from specbench.tasks import eval as eval_task
from specbench.tasks.train import train
from specbench.training.medusa import MedusaModule, sine_ramp
from specbench.trees.chain import ChainPolicy
from specbench.trees.greedy import GreedyPolicy
from specbench.trees.static import StaticPolicy

from .conftest import compose_cfg, random_medusa_artifact
from .test_training import SMALL

PROMPTS = [[5, 17, 99, 3, 42, 42, 7], [200, 201, 202, 5, 5, 5, 5, 9], list(range(60, 90))]


@pytest.fixture(scope="module")
def heads_artifact(tmp_path_factory, tiny):
    acc = [[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.1]]
    return random_medusa_artifact(tmp_path_factory.mktemp("medusa") / "m.safetensors", tiny, acc)


def decode(tiny, drafter, prompt, n=40):
    return Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), n).generate(prompt)


@pytest.mark.parametrize("budget", [4, 12])
def test_medusa_greedy_output_equals_plain_decoding(tiny, heads_artifact, budget):
    drafter = MedusaDrafter(tiny, GreedyPolicy(budget, accept_prob=None), str(heads_artifact))
    for prompt in PROMPTS:
        ar = decode(tiny, PlainDrafter(), prompt)
        gen = decode(tiny, drafter, prompt)
        assert gen.tokens == ar.tokens
        assert max(s.tree_size for s in gen.steps) == budget


def test_medusa_heads_predict_from_the_last_accepted_node(tiny, heads_artifact):
    """Exact drafts: heads whose guesses are the AR continuation get every draft accepted (tau = heads + 1)."""
    drafter = MedusaDrafter(tiny, StaticPolicy(choices=[[0], [0, 0], [0, 0, 0]]), str(heads_artifact))
    prompt = PROMPTS[0]
    ar = decode(tiny, PlainDrafter(), prompt, n=30).tokens
    positions = {}

    def oracle(hidden, lm_head):  # look the true continuation up by the hidden state's identity
        key = round(float(hidden.sum()), 3)
        i = positions[key]
        out = torch.full((3, tiny.model.config.vocab_size), -1e4)
        for k in range(3):
            if i + k + 1 < len(ar):
                out[k, ar[i + k + 1]] = 0.0
        return out

    with torch.inference_mode():
        seq = torch.tensor([prompt + ar])
        hidden = tiny.model(seq, output_hidden_states=True).hidden_states[-1][0]
    for i in range(len(ar)):
        positions[round(float(hidden[len(prompt) - 1 + i].sum()), 3)] = i
    drafter.heads = oracle
    gen = decode(tiny, drafter, prompt, n=30)
    assert gen.tokens == ar and gen.accept_lengths[:5] == [4] * 5


def test_a_tree_deeper_than_the_heads_is_refused(tiny, heads_artifact):
    """A static tree is refused when the drafter is built; a chain grown past the heads when it gets there."""
    with pytest.raises(SpecbenchError, match="tree=static is 4 tokens deep, but .* drafts with 3 heads"):
        MedusaDrafter(tiny, StaticPolicy(choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]), str(heads_artifact))
    drafter = MedusaDrafter(tiny, ChainPolicy(budget=5), str(heads_artifact))
    with pytest.raises(SpecbenchError, match="3 heads"):
        decode(tiny, drafter, PROMPTS[0])


def test_untied_heads_start_as_the_lm_head(tiny):
    """The paper's init (§2.1.1): each head's projection is its own trainable copy of the LM head (its block's W1 is
    zero, as in the Medusa repo; the bias keeps its default init)."""
    from specbench.training.medusa import MedusaModule

    module = MedusaModule(tiny_random().model, num_heads=2, tie_lm_head=False)
    lm = module.lm_head.weight
    assert all(torch.equal(p.weight, lm) and p.weight.data_ptr() != lm.data_ptr() for p in module.heads.proj)
    h = torch.randn(3, lm.shape[1])
    blocks = torch.stack([b(h) for b in module.heads.blocks])
    assert torch.allclose(module.heads(h, module.lm_head), module.lm_head(blocks), atol=1e-5)
    assert all(torch.count_nonzero(b[0].linear.weight) == 0 for b in module.heads.blocks)
    assert module.heads.proj[0].weight.requires_grad and not lm.requires_grad


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.slow
def test_tied_and_untied_artifacts_load_and_decode_losslessly(tmp_path, tiny, tie):
    cfg = compose_cfg(["method=medusa", *SMALL, "method.train.max_steps=2",
                       f"method.train.module.tie_lm_head={str(tie).lower()}"], tmp_path)
    summary = train(cfg, tmp_path)
    drafter = MedusaDrafter(tiny, GreedyPolicy(8, accept_prob=None), summary["artifact"])
    assert (drafter.heads.proj is None) == tie and drafter.backbone is None
    for prompt in PROMPTS[:2]:
        assert decode(tiny, drafter, prompt).tokens == decode(tiny, PlainDrafter(), prompt).tokens


@pytest.mark.parametrize(("step", "want"), [(0, 0.0), (49, 0.0), (50, 0.0), (75, 0.01 * 2**-0.5), (100, 0.01),
                                            (120, 0.01)])
def test_lambda0_sine_ramp(step, want):
    """Heads warm up alone for steps 0-49 (start=50); then 0.01 * sin(pi/2 * (step-50)/50): halfway, sin(pi/4)."""
    assert sine_ramp(step, start=50, total=100, peak=0.01) == pytest.approx(want, abs=1e-12)


def test_medusa2_heads_warm_up_alone_then_train_with_lora_at_a_quarter_lr(tiny):
    module = MedusaModule(tiny_random().model, joint=True, lora={"r": 4, "target_modules": ["q_proj"]}, lr=4e-4)
    heads_group, lora_group = module.param_groups()
    assert heads_group["lr"] == 4e-4 and lora_group["lr"] == 1e-4
    assert all("lora" in n for n, p in module.backbone.named_parameters() if p.requires_grad)


def _perturb(module) -> None:
    """A non-trivial adapter: LoRA B starts at zero (the adapter is then the identity); random B changes the model."""
    torch.manual_seed(0)
    for name, p in module.backbone.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)


@pytest.fixture(scope="module")
def medusa2_artifact(tmp_path_factory, tiny):
    """A Medusa-2 artifact whose adapter is non-trivial: LoRA B starts at zero (the identity); random B changes the
    model, so the tuned backbone's greedy output differs from the original's."""
    tmp = tmp_path_factory.mktemp("medusa2")
    cfg = compose_cfg(["method=medusa", *SMALL, "method.train.module.joint=true", "method.train.module.lora.r=4"], tmp)
    module = build(cfg.method.train.module, backbone=tiny_random(dtype="float32").model)
    torch.manual_seed(0)
    for name, p in module.backbone.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    return save_artifact(tmp / "m2.safetensors", "medusa", tiny, module.arch(), module.export_tensors(),
                         metrics={"rank_accuracy": [[0.5, 0.2]] * 4})


def test_medusa2_decodes_with_its_tuned_backbone_losslessly(tiny, medusa2_artifact):
    """The artifact alone rebuilds the tuned backbone; Medusa-2 reproduces THAT backbone's plain decoding, which here
    differs from the original model's (so decoding with the original backbone would fail the check)."""
    drafter = MedusaDrafter(tiny, GreedyPolicy(8, accept_prob=None), str(medusa2_artifact))
    tuned = drafter.backbone
    assert tuned is not None and tuned.name.startswith(f"{tiny.name}+medusa2:") and tuned.model is not tiny.model
    differs = 0
    for prompt in PROMPTS:
        reference = Decoder(tuned.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 40).generate(prompt)
        gen = Decoder(tuned.model, drafter, ExactAcceptance(), SamplingParams(), 40).generate(prompt)
        assert gen.tokens == reference.tokens
        differs += reference.tokens != decode(tiny, PlainDrafter(), prompt).tokens
    assert differs >= 2


@pytest.mark.parametrize("backend", ["eager", "prepacked"])
@pytest.mark.slow
def test_the_evaluator_checks_medusa2_against_its_own_backbone(tmp_path, medusa2_artifact, backend):
    """On a fast backend too: the adapter is merged into a copy of the eager target, which then runs on the backend."""
    cfg = compose_cfg(["model=tiny_random", f"model.backend={backend}", "eval.dtype=float32", "eval.num_prompts=3", "eval.max_new_tokens=24",
                       "eval.first_turn_only=true", "eval.warmup=0", "eval.memory_probe=false",
                       "eval.fastest_plain=false", "eval.latency_profile=false", "method=medusa",
                       f"method.checkpoint={medusa2_artifact}", "tree.budget=8"], tmp_path)
    summary = eval_task.run(cfg).set_index("method")
    assert summary.loc["medusa", "lossless_reference"] == "plain@medusa"
    assert summary.loc["medusa", "lossless_match"] == 1.0
    assert summary.loc["medusa", "model"].startswith("tiny_random+medusa2:")
    assert summary.loc["medusa", "backend"] == backend
    assert summary.loc["plain@medusa", "lossless_match"] < 1.0  # the tuned backbone's agreement with the original
    assert summary.loc["plain", "lossless_reference"] == "plain"


def test_medusa2_trains_with_the_adapter_inside_the_artifact(tmp_path, tiny):
    cfg = compose_cfg(["method=medusa", *SMALL, "method.train.module.joint=true", "method.train.max_steps=2",
                       "method.train.module.lora.r=4", "method.train.module.tie_lm_head=true"], tmp_path)
    summary = train(cfg, tmp_path)
    meta, tensors = load_artifact(summary["artifact"], "medusa", tiny)
    assert meta["arch"]["lora"]["target_modules"][-1] == "down_proj"
    assert any(k.startswith(ADAPTER_PREFIX) and "down_proj.lora_A" in k for k in tensors)
    assert 0.0 <= summary["val/backbone_agreement"] <= 1.0


def test_calibrate_a_medusa_of_fewer_heads_and_size_its_tree_from_the_file(tiny, tmp_path):
    """A 3-head checkpoint without accuracies (as a published one): task=calibrate probes as deep as its heads
    draft, or says which +calibration.depth to give, and tree=hardware_aware takes the file it wrote."""
    from specbench.tasks import dispatch
    from specbench.trees.hardware_aware import HardwareAwarePolicy

    checkpoint = random_medusa_artifact(tmp_path / "m.safetensors", tiny, None)
    calibrate = ["task=calibrate", "model=tiny_random", "method=medusa", f"method.checkpoint={checkpoint}",
                 "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8", "+calibration.ranks=3"]
    with pytest.raises(SpecbenchError, match=r"^calibration.depth=5 is invalid for method=medusa: it drafts at most 3 "
                                             r"tokens deep, so give \+calibration.depth=3 or less$"):
        dispatch(compose_cfg([*calibrate, "+calibration.depth=5"], tmp_path))
    out = dispatch(compose_cfg([*calibrate, f"+calibration.out={tmp_path / 'cal.json'}"], tmp_path))
    tree = HardwareAwarePolicy(budget=8, accept_prob=str(out))
    drafter = MedusaDrafter(tiny, tree, str(checkpoint))
    drafter.fit(lambda n: 5.0 + n)
    assert len(tree.accept_table) == 3 and 2 <= drafter.tree.budget <= 8
    deeper = tmp_path / "deeper.json"
    deeper.write_text('{"accept_prob": [[0.5], [0.5], [0.5], [0.5]]}')
    with pytest.raises(SpecbenchError, match="tree=hardware_aware may grow 4 tokens deep, but the Medusa checkpoint "
                                             ".* drafts with 3 heads"):
        MedusaDrafter(tiny, HardwareAwarePolicy(budget=8, accept_prob=str(deeper)), str(checkpoint))
