"""task=train end to end on the tiny model: Lightning fit, trainable-only checkpoints, resume, artifact checks."""

import json

import lightning as L
import pytest

from specbench.data.sharegpt import read_sharegpt
from specbench.errors import SpecbenchError
from specbench.tasks.train import train
from specbench.models.artifact import load_artifact, save_artifact
from specbench.training.sharegpt import format_conversation

from .conftest import compose_cfg

SMALL = ["model=tiny_random", "method.train.data.num_conversations=10", "method.train.data.num_val=3",
         "method.train.data.max_length=96", "method.train.data.batch_size=2", "method.train.data.self_distill=null",
         "method.train.epochs=1", "method.train.checkpoint_every_n_steps=1", "trainer.log_every_n_steps=1"]


def test_sharegpt_salvages_the_truncated_file_and_marks_assistant_tokens(tiny):
    conversations = read_sharegpt(3)
    assert len(conversations) == 3 and conversations[0][0]["role"] == "user"
    example = format_conversation(tiny.tokenizer, conversations[0], 400)
    text = tiny.tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])
    assert text.strip() and conversations[0][1]["content"].startswith(text[:20])


@pytest.mark.parametrize("method", ["medusa", "ppd"])
def test_train_exports_an_artifact_the_drafter_loads(method, tmp_path, tiny):
    cfg = compose_cfg([f"method={method}", "method.train.max_steps=2", *SMALL], tmp_path)
    summary = train(cfg, tmp_path)
    meta, tensors = load_artifact(summary["artifact"], method, tiny)
    assert meta["train"]["module"]["_target_"].endswith("Module") and tensors
    assert meta["metrics"]["trainable_params"] == sum(t.numel() for t in tensors.values())  # what trains is stored
    assert 0 < meta["metrics"]["trainable_share"] and len(meta["metrics"]["rank_accuracy"]) >= 3
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and (tmp_path / "logs" / "metrics.csv").exists()


class Interrupt(L.Callback):
    """Kills the fit once `at` optimizer steps are done (and checkpointed), as a crash or Ctrl-C would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step >= self.at:
            raise RuntimeError("simulated interruption")


class FirstStep(L.Callback):
    def on_train_batch_start(self, trainer, *args) -> None:
        self.seen = getattr(self, "seen", trainer.global_step)


def test_interrupted_training_resumes_from_the_saved_step(tmp_path):
    cfg = compose_cfg(["method=medusa", *SMALL, "method.train.epochs=3"], tmp_path)
    with pytest.raises(RuntimeError, match="simulated interruption"):
        train(cfg, tmp_path, callbacks=[Interrupt(at=3)])
    first = FirstStep()
    summary = train(cfg, tmp_path, callbacks=[first])
    assert first.seen == 3  # continued from the checkpoint at step 3, not from 0
    assert summary["global_step"] > 3


def test_artifacts_are_checked_before_use(tmp_path, tiny):
    from specbench.models import tiny_random

    path = save_artifact(tmp_path / "a.safetensors", "medusa", tiny, {}, {"w": tiny.model.lm_head.weight[:2]})
    with pytest.raises(SpecbenchError, match="hidden size"):
        load_artifact(path, "medusa", tiny_random(hidden_size=32))
    with pytest.raises(SpecbenchError, match="'medusa' drafter, not a 'ppd'"):
        load_artifact(path, "ppd", tiny)
    with pytest.raises(SpecbenchError, match="does not exist"):
        load_artifact(tmp_path / "missing.safetensors", "medusa", tiny)
    (tmp_path / "a.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(SpecbenchError, match="not a specbench drafter artifact"):
        load_artifact(path, "medusa", tiny)
    (tmp_path / "b.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(SpecbenchError, match="not a specbench drafter artifact"):
        load_artifact(tmp_path / "b.safetensors", "medusa", tiny)
