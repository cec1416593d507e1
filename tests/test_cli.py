"""`python run.py` as a user runs it: bad input ends with one clear line naming the problem (refusals the CLI prints
through its one shared path are checked in this process, below)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.errors import SpecbenchError
from specbench.tasks import dispatch

from .conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=tiny_random", "method=pld", "eval.dtype=float32", "eval.max_new_tokens=8", "eval.warmup=0",
        "eval.latency_profile=false", "eval.fastest_plain=false"]


def run(args, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    return subprocess.run([sys.executable, "run.py", *args, f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def last_line(proc):
    return proc.stderr.strip().splitlines()[-1]


def test_help_lists_the_config_groups(tmp_path):
    out = run(["--help"], tmp_path).stdout
    for group in ("model", "method", "tree", "accept", "hw", "dataset", "eval", "logger"):
        assert f"{group}:" in out


@pytest.mark.parametrize("group", ["model", "method", "dataset"])
def test_unknown_choice_names_it_and_the_valid_ones(group, tmp_path):
    proc = run([f"{group}=nonexistent"], tmp_path)
    assert proc.returncode != 0
    assert f"Could not find '{group}/nonexistent'" in proc.stderr and "Available options" in proc.stderr


def test_an_unknown_experiment_is_one_line_naming_every_saved_one_and_the_closest(monkeypatch, capsys):
    """experiment/ nests its files by question (GROUP/NAME), which Hydra's message for an unknown choice leaves out:
    a flat name (as an old run folder records it) is refused before Hydra composes, pointed at its place."""
    from specbench.cli import experiment_options, main, unknown_experiment

    options = experiment_options()
    assert {"speed/same_model", "seeds/medusa_table1", "gpu/same_model"} <= set(options)
    monkeypatch.setattr(sys, "argv", ["run.py", "eval.num_prompts=2", "experiment=seed_medusa_table1"])
    with pytest.raises(SystemExit) as exited:
        main()
    line = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "\n" not in line
    assert line.startswith("error: experiment=seed_medusa_table1 is not a saved experiment (closest: "
                           "seeds/medusa_table1); valid: ") and all(o in line for o in options)
    assert "(closest: gpu/same_model or speed/same_model)" in unknown_experiment(["experiment=same_model"])
    assert unknown_experiment(["-m", "experiment=speed/same_model,gpu/nope"]).startswith("experiment=gpu/nope ")
    assert unknown_experiment(["experiment=speed/same_model", "+experiment=null", "method=pld"]) is None


@pytest.mark.parametrize(("arg", "new"), [("eval.fastest_ar=false", "eval.fastest_plain=false"),
                                          ("+eval.baseline=true", "eval.plain=true"),
                                          ("method=autoregressive", "method=plain")])
def test_a_setting_named_before_plain_decoding_had_one_name_is_one_line_naming_the_new(arg, new, monkeypatch, capsys):
    from specbench.cli import main

    monkeypatch.setattr(sys, "argv", ["run.py", "eval.num_prompts=2", arg])
    with pytest.raises(SystemExit) as exited:
        main()
    line = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "\n" not in line
    assert line == f"error: {arg} is invalid: plain decoding's settings and method are named plain now; give {new}"


# Refusals whose one line the CLI prints like every other SpecbenchError (that path: test_bad_inputs.py's
# test_run_py_prints_one_line_and_loads_nothing) are checked in this process, through the same dispatch: a subprocess
# would spend ~9 s importing torch and transformers to say the same.
def refusal(args, tmp_path) -> str:
    with pytest.raises(SpecbenchError) as caught:
        dispatch(compose_cfg(args, tmp_path / "run"))
    return str(caught.value)


def test_malformed_dataset_line(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n{not json\n")
    line = refusal([*TINY, "dataset=jsonl", f"dataset.path={data}"], tmp_path)
    assert line.startswith("dataset file") and "line 2 is malformed" in line


def test_empty_dataset(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    assert "is empty" in refusal([*TINY, "dataset=jsonl", f"dataset.path={data}"], tmp_path)


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_skipped_and_counted(tmp_path):
    data = tmp_path / "long.jsonl"
    rows = [{"question_id": "long", "category": "x", "turns": ["word " * 200]},
            {"question_id": "short", "category": "x", "turns": ["hi"]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run([*TINY, "model.max_context=64", "dataset=jsonl", f"dataset.path={data}", "eval.max_new_tokens=60"],
               tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {r["method"]: (r["skipped_prompts"], r["num_prompts"]) for r in summary} == {
        "plain": (1, 1), "pld": (1, 1)}
    # the short prompt fits, but not with 60 new tokens: counted, and named with where it is cut
    assert {r["method"]: r["cut_by_context"] for r in summary} == {"plain": 1, "pld": 1}
    assert "1 prompt(s) plus eval.max_new_tokens=60 pass the model's context of 64 tokens" in proc.stdout
    assert "short (turn 1," in proc.stdout


def test_settings_are_checked_before_any_model_or_data_loads(tmp_path):
    line = refusal([*TINY, "model=hf", "model.path=/nonexistent/model", "dataset=jsonl",
                    "dataset.path=/nonexistent.jsonl", "eval.max_new_tokens=-5"], tmp_path)
    assert line == "eval.max_new_tokens=-5 is invalid: it must be an integer >= 1"


def test_a_batch_size_of_zero_is_one_clear_line(tmp_path):
    assert refusal([*TINY, "eval.batch_size=0"], tmp_path).startswith("eval.batch_size=0 is invalid")


@pytest.mark.slow
def test_an_unknown_method_in_a_methods_list_names_the_valid_ones(tmp_path):
    proc = run([*TINY, "methods=[pld,nonexistent]"], tmp_path)
    assert proc.returncode == 2
    assert "methods entry 'nonexistent' is not a method config; valid:" in last_line(proc) and "medusa" in last_line(proc)


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path):
    proc = run([*TINY, "eval.num_prompts=2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = tmp_path / "run"
    for name in (".hydra/config.yaml", "records.jsonl", "summary.json", "summary.csv", "logs/metrics.csv"):
        assert (run_dir / name).exists(), name
    assert "pld" in proc.stdout and "plain" in proc.stdout
    # no library notice about how the project calls it reaches the user's terminal (transformers 5.24 logs one line
    # for the past_key_values= every forward passes)
    noise = [line for line in (proc.stdout + proc.stderr).splitlines() if "deprecated" in line or "Warning" in line]
    assert not noise, noise


@pytest.mark.slow
def test_wandb_logger_writes_an_offline_run(tmp_path, monkeypatch):
    """Offline by the logger config alone (no WANDB_MODE): metrics, the plots and records.jsonl as an artifact."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    proc = subprocess.run([sys.executable, "run.py", *TINY, "eval.num_prompts=1", "logger=wandb",
                           f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    offline = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and not list((tmp_path / "run" / "wandb").glob("run-*"))  # nothing went online
    log = next(offline[0].glob("run-*.wandb")).read_bytes()
    assert b"pld/tau" in log and b"records-" in log  # the metrics and the records artifact
    assert list((offline[0] / "files" / "media" / "images").glob("plots_*.png"))


def test_transformers_notice_about_the_cache_argument_name_stays_off_the_terminal(tiny):
    """Every forward passes past_key_values= and reads .past_key_values, which transformers 5.24 renames to cache=;
    its one-time logger line about it says nothing about the user's run (specbench.models.loading filters it)."""
    import logging

    from transformers import DynamicCache

    import specbench.models.loading  # noqa: F401  (what every run and notebook imports before a forward)

    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    warn_once = getattr(logging.Logger, "warning_once", None)
    if warn_once is not None:
        warn_once.cache_clear()  # a notice logged earlier in this process is not logged again
    try:
        out = tiny.model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=DynamicCache(config=tiny.model.config))
        assert out.past_key_values is not None
    finally:
        library.removeHandler(handler)
    assert not [r.getMessage() for r in seen if "deprecated" in r.getMessage()]


def test_the_printed_table_says_how_many_prompts_were_skipped_and_why(tmp_path, capsys):
    from specbench.tasks import eval as eval_task

    data = tmp_path / "long.jsonl"
    rows = [{"question_id": "long", "category": "x", "turns": ["word " * 200]},
            {"question_id": "short", "category": "x", "turns": ["hi"]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    eval_task.run(compose_cfg([*TINY, "model.max_context=64", "dataset=jsonl", f"dataset.path={data}",
                               "eval.num_prompts=2"], tmp_path / "run"))
    assert ("skipped: 1 prompt(s) with no room to answer in the model's context of 64 tokens, left out of every "
            "column above (skipped_prompts in summary.csv)") in capsys.readouterr().out


@pytest.mark.parametrize("load", [0.1, 50.0])
def test_timings_made_on_a_busy_machine_carry_a_notice(load, tmp_path, capsys, monkeypatch):
    """The load average as each answer is recorded (records' load_1min) decides, by the machine profile's rule."""
    from specbench.tasks import eval as eval_task

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    summary = eval_task.run(compose_cfg([*TINY, "eval.num_prompts=2"], tmp_path / "run"))
    assert (summary["load_1min_max"] == load).all()
    notice = (f"notice: timings were made on a busy machine (1-min load up to 50.0 on {os.cpu_count()} CPUs while "
              f"decoding): other work shared the CPU, so tokens/s and speedups may be off; rerun on a quiet machine")
    assert (notice in capsys.readouterr().out) == (load == 50.0)


def hydra_run(overrides: list[str], folder: Path):
    """The run config as Hydra hands it to the run-folder callback, before it writes into hydra.run.dir."""
    from hydra import compose, initialize_config_dir
    from hydra.core.utils import setup_globals

    from .conftest import CONF

    setup_globals()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=[*overrides, f"hydra.run.dir={folder}"],
                       return_hydra_config=True)


def test_no_task_writes_into_another_runs_folder(tmp_path, capsys):
    """A replay into the run it reads, or any task into a folder holding another task's run: one line before Hydra
    writes .hydra/ (or the task its files) there. A folder of the same task resumes, keeping the .hydra/ that made it."""
    from specbench.cli import WritableRunFolder

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("")  # an evaluation's folder, as experiments/ keep them (no .hydra/)

    def refusal(overrides, folder):
        with pytest.raises(SystemExit) as exc:
            WritableRunFolder().on_run_start(hydra_run(overrides, folder))
        assert exc.value.code == 2
        return capsys.readouterr().err.strip()

    assert refusal(["task=replay", "method=pld", f"replay.run={run}"], run) == (
        f"error: hydra.run.dir={run} is replay.run, the run the replay reads: a replay writes its own summary.csv and "
        f"replay.csv, which would replace the run's; leave hydra.run.dir out (a new folder under outputs/replay/) or "
        f"give another")
    assert refusal(["task=replay", "method=pld", "replay.run=elsewhere"], run) == (
        f"error: hydra.run.dir={run} holds a finished task=eval run, whose files task=replay would replace: give a "
        f"new hydra.run.dir (or leave it out for a fresh one)")
    replayed = tmp_path / "replayed"
    (replayed / ".hydra").mkdir(parents=True)
    (replayed / ".hydra" / "config.yaml").write_text("task: replay\n")
    (replayed / ".hydra" / "overrides.yaml").write_text(f"- task=replay\n- method=pld\n- replay.run={run}\n")
    assert refusal(["task=replay", "method=sssd", f"replay.run={run}"], replayed).startswith(
        f"error: hydra.run.dir={replayed} holds a task=replay run of other settings (method=pld replay.run={run} "
        f"task=replay)")
    again = hydra_run(["task=replay", f"replay.run={run}", "method=pld"], replayed)  # the same command: rerun
    WritableRunFolder().on_run_start(again)
    assert again.hydra.output_subdir is None  # the folder's .hydra/ stays the one that made it
    resumed = hydra_run(["eval.num_prompts=3"], run)
    WritableRunFolder().on_run_start(resumed)
    assert resumed.hydra.output_subdir == ".hydra"  # a new .hydra/ beside the records kept without one
