"""Every option of every config group composes, and the cheap ones instantiate (lightning-hydra-template style)."""

from pathlib import Path

import pytest
from hydra.utils import instantiate

from specbench.acceptance.base import AcceptanceRule
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.tasks import available
from specbench.trees.policy import TreePolicy

from .conftest import CONF, compose_cfg


def options(group: str) -> list[str]:
    """A group's choices as the command line names them: experiment/ nests its files by question (GROUP/NAME)."""
    root = Path(CONF) / group
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "method", "tree", "accept", "hw", "dataset", "sampling", "eval",
                                   "logger", "trainer", "experiment"])
@pytest.mark.slow
def test_every_option_composes(group, tmp_path):
    for choice in options(group):
        cfg = compose_cfg([f"{group}={choice}"], tmp_path)
        assert cfg.task in available()


@pytest.mark.parametrize("choice", options("tree"))
def test_tree_policies_instantiate(choice, tmp_path):
    policy = instantiate(compose_cfg([f"tree={choice}"], tmp_path).tree)
    assert isinstance(policy, TreePolicy)


@pytest.mark.parametrize("choice", options("accept"))
def test_acceptance_rules_instantiate_and_declare_losslessness(choice, tmp_path):
    rule = instantiate(compose_cfg([f"accept={choice}"], tmp_path).accept)
    assert isinstance(rule, AcceptanceRule) and isinstance(rule.lossless, bool)


@pytest.mark.parametrize("choice", options("hw"))
def test_hardware_specs_instantiate(choice, tmp_path):
    hw = instantiate(compose_cfg([f"hw={choice}"], tmp_path).hw)
    assert isinstance(hw, HardwareSpec)
    # the machine at hand is measured (cached profile); a board states a positive peak for the dtype it runs
    assert hw.peak_tflops == "measured" or hw.peak_flops(hw.weight_dtype) > 0


@pytest.mark.parametrize("choice", options("method"))
def test_methods_build_a_drafter_for_the_tiny_model_or_say_what_is_missing(choice, tmp_path, tiny, monkeypatch):
    import specbench.data.prompts as prompt_data

    # SSSD builds its default datastore on first use: from three conversations here, not all of ShareGPT
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(prompt_data, "read_sharegpt", lambda n: [[{"role": "user", "content": "a cat sat"}]] * 3)
    cfg = compose_cfg([f"method={choice}", "model=tiny_random"], tmp_path)
    try:
        drafter = build_drafter(cfg.method.drafter, tiny, instantiate(cfg.tree))
    except SpecbenchError as exc:  # e.g. a trained method without a checkpoint for this model: a clear message
        assert str(exc)
        return
    assert hasattr(drafter, "propose")


@pytest.mark.parametrize("choice", [c for c in options("dataset") if c != "jsonl"])
def test_offline_datasets_load(choice, tmp_path):
    ds = instantiate(compose_cfg([f"dataset={choice}", "eval.num_prompts=5"], tmp_path).dataset)
    assert len(ds) == 5 and all(p.turns[0] for p in ds)


def test_mt_bench_round_robin_covers_every_category(tmp_path):
    ds = instantiate(compose_cfg(["dataset=mt_bench", "eval.num_prompts=16"], tmp_path).dataset)
    assert len({p.category for p in ds}) == 8


@pytest.mark.parametrize("tree", ["static", "chain", "dynamic", "greedy", "hardware_aware"])
def test_medusa_composes_with_every_tree_it_accepts(tree, tmp_path):
    """The method file sets no tree keys of one policy, so picking another policy leaves no stray key behind."""
    cfg = compose_cfg(["method=medusa", f"tree={tree}"], tmp_path)
    assert instantiate(cfg.tree).name == tree


def test_the_default_run_compares_plain_decoding_pld_and_sssd_with_the_installed_engines():
    """`python run.py` with nothing named: method=first_look, PLD and SSSD beside plain decoding on answers long enough
    for drafting to show, the installed engines beside them; naming a method runs it alone."""
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONF

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        default, named = compose(config_name="config"), compose(config_name="config", overrides=["method=medusa"])
    entries = [m if isinstance(m, str) else m["method"] for m in default.methods]
    assert entries == ["pld", "sssd"] and default.eval.max_new_tokens >= 64
    assert list(default.eval.engines) == ["installed"]
    # the machine chooses among the engines' weight format and ONNX Runtime's own int8 one, among the deployed
    # runtimes; a named method keeps the model's float default
    assert default.model.weights == "auto" and list(default.eval.profile_weights) == ["int4", "w8a8s"]
    assert {"openvino", "onnxruntime"} <= set(default.eval.profile_backends)
    assert named.model.weights == "fp"
    assert named.methods is None and named.method.name == "medusa" and list(named.eval.engines) == []
