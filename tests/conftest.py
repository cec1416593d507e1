import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# Under pytest-xdist (`-n auto`, the README's command) each worker is one process on one core: torch's intra-op
# threads would make the workers wait for each other (OpenMP spins), and subprocesses inherit the setting.
THREADS = 1 if "PYTEST_XDIST_WORKER" in os.environ else 2
if THREADS == 1:
    os.environ["OMP_NUM_THREADS"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from specbench.config import CONF_DIR  # noqa: E402
from specbench.models import tiny_random  # noqa: E402

CONF = str(CONF_DIR)  # what the package ships


@pytest.fixture(scope="session")
def tiny():
    """A float32 tiny random Llama: losslessness is proven in fp32."""
    torch.set_num_threads(THREADS)
    return tiny_random(dtype="float32")


def compose_cfg(overrides: list[str], run_dir: Path | None = None):
    """The composed run config, as `python run.py OVERRIDES` would see it (outside a Hydra run). A test that names no
    method runs method=pld's settings (alone, or under the `methods` it lists), as the suite's runs always have: the
    default run's comparison (method=first_look, with the installed engines beside it) is tested by name."""
    named = any(o.split("=", 1)[0].lstrip("+~") == "method" for o in overrides)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        extra = [f"run_dir={run_dir}", "~logger"] if run_dir is not None else []
        return compose(config_name="config", overrides=([] if named else ["method=pld"]) + overrides + extra)


def random_medusa_artifact(path: Path, target, rank_accuracy: list[list[float]]) -> Path:
    """A Medusa artifact of 3 random heads for `target` (a LoadedModel), with the given per-head rank accuracies."""
    from specbench.drafters.medusa import MedusaHeads
    from specbench.models.artifact import save_artifact

    torch.manual_seed(1)
    cfg = target.model.config
    heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads=3)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    arch = {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_heads": 3, "num_layers": 1,
            "tie_lm_head": True}
    return save_artifact(path, "medusa", target, arch, heads.state_dict(), metrics={"rank_accuracy": rank_accuracy})
