"""A training folder keyed on its settings (issue 34): a rerun with other settings is refused with the keys named
before the model loads, method.train.resume=false starts over with the earlier training kept, a cut last.ckpt is one
line, a run that trained nothing exports nothing, and a fit killed with SIGKILL resumes from last.ckpt."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from specbench.errors import SpecbenchError
from specbench.tasks import train as train_task
from specbench.tasks.train import train

from .conftest import compose_cfg
from .test_training import SMALL

ROOT = Path(__file__).resolve().parents[1]
DONE = ["method=medusa", *SMALL, "method.train.max_steps=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A training folder that finished its 2 steps."""
    folder = tmp_path_factory.mktemp("trained")
    assert train(compose_cfg(DONE, folder), folder)["global_step"] == 2
    return folder


@pytest.fixture
def folder(finished, tmp_path, monkeypatch):
    """A copy of the finished folder; a refused rerun must stop before the target loads."""
    shutil.copytree(finished, tmp_path / "run")
    monkeypatch.setattr(train_task, "build_model", lambda *a, **k: pytest.fail("the model loaded"))
    return tmp_path / "run"


def refused(folder: Path, overrides: list[str]) -> str:
    weights = (folder / "medusa.safetensors").read_bytes()
    with pytest.raises(SpecbenchError) as exc:
        train(compose_cfg(overrides, folder), folder)
    assert (folder / "medusa.safetensors").read_bytes() == weights
    assert "\n" not in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize(("override", "named"), [
    ("method.train.module.lr=0.01", "method.train.module.lr: 0.001 -> 0.01"),
    ("method.train.data.max_length=64", "method.train.data.max_length: 96 -> 64"),
    ("method.train.max_steps=4", "method.train.max_steps: 2 -> 4"),
    ("method.train.module.num_heads=2", "method.train.module.num_heads: 4 -> 2"),
])
def test_a_rerun_with_other_settings_is_refused_naming_the_keys(folder, override, named):
    message = refused(folder, [*DONE, override])
    assert message.startswith(f"training folder '{folder}' holds a training made with other settings ({named})")
    assert "method.train.resume=false" in message


@pytest.mark.slow
def test_the_command_line_refuses_with_one_error_line(folder):
    proc = subprocess.run([sys.executable, "run.py", "task=train", *DONE, "method.train.module.lr=0.01",
                           f"hydra.run.dir={folder}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline"))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "(method.train.module.lr: 0.001 -> 0.01)" in errors[0]


def test_settings_that_shape_no_weights_resume(folder, monkeypatch):
    """The checkpoint frequency and the progress bar change how the fit runs, not what it trains."""
    monkeypatch.undo()
    summary = train(compose_cfg([*DONE, "method.train.checkpoint_every_n_steps=5", "trainer.enable_progress_bar=false"],
                                folder), folder)
    assert summary["global_step"] == 2


@pytest.mark.slow
def test_resume_false_starts_over_and_keeps_the_earlier_training(folder, monkeypatch, caplog):
    monkeypatch.undo()
    old = (folder / "medusa.safetensors").read_bytes()
    summary = train(compose_cfg([*DONE, "method.train.module.lr=0.01", "method.train.resume=false"], folder), folder)
    assert summary["global_step"] == 2
    meta = json.loads((folder / "medusa.json").read_text())
    assert meta["train"]["module"]["lr"] == 0.01 and (folder / "medusa.safetensors").read_bytes() != old
    assert pd.read_csv(folder / "logs" / "metrics.csv")["step"].min() == 0  # trained from step 0
    [earlier] = (folder / "earlier").iterdir()
    assert (earlier / "medusa.safetensors").read_bytes() == old and (earlier / "checkpoints" / "last.ckpt").exists()
    assert json.loads((earlier / "settings.json").read_text())["method"]["train"]["module"]["lr"] == 0.001
    assert json.loads((folder / "settings.json").read_text())["method"]["train"]["module"]["lr"] == 0.01
    assert f"moved to {earlier}" in caplog.text and "method.train.module.lr: 0.001 -> 0.01" in caplog.text


def test_a_cut_checkpoint_is_one_line(folder):
    last = folder / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    message = refused(folder, DONE)
    assert message.startswith(f"checkpoint '{last}' is cut short or damaged (File is not a zip file)")
    assert "method.train.resume=false" in message


def test_checkpoints_without_settings_are_refused(folder):
    (folder / "settings.json").unlink()
    message = refused(folder, DONE)
    assert message.startswith(f"training folder '{folder}' holds a training but no settings.json")


@pytest.mark.parametrize("text", ["{cut", '{"shared": {}, "methods": {}}'])
def test_a_damaged_or_foreign_settings_file_is_one_line(folder, text):
    (folder / "settings.json").write_text(text)  # cut short, or an eval run folder's
    assert refused(folder, DONE).startswith(f"{folder / 'settings.json'} is not ")


def test_a_run_that_trains_nothing_exports_nothing(tmp_path, caplog):
    """max_steps=0 prepares (and caches) the data only, e.g. self-distillation on a GPU: no untrained heads."""
    summary = train(compose_cfg(["method=medusa", *SMALL, "method.train.max_steps=0"], tmp_path), tmp_path)
    assert summary == {"artifact": None, "global_step": 0}
    assert not list(tmp_path.glob("medusa.*")) and not (tmp_path / "train_summary.json").exists()
    assert "method.train.max_steps=0: trained nothing, so no artifact is written" in caplog.text


@pytest.mark.slow
def test_a_fit_killed_with_sigkill_resumes_from_last_ckpt_and_finishes(tmp_path):
    run = [sys.executable, "run.py", "task=train", "method=medusa", *SMALL, "method.train.data.num_conversations=40",
           "method.train.data.max_length=256", "method.train.max_steps=10", "trainer.enable_progress_bar=false",
           f"hydra.run.dir={tmp_path / 'run'}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", SPECBENCH_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(run, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    while not last.exists() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "run" / "medusa.safetensors").exists()  # killed mid-fit
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Restoring states from the checkpoint path" in done.stderr
    assert pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")["step"].min() > 0  # not from step 0
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["global_step"] == 10
