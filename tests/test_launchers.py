"""Hydra launchers: every conf/hydra/launcher option composes and instantiates; a small sweep runs through joblib and
through a local Ray instance; the SLURM launcher writes the sbatch script submitit would submit."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.plugins import Plugins
from hydra.types import HydraContext

from .conftest import CONF

ROOT = Path(__file__).resolve().parents[1]
# two jobs of a few seconds each: the launcher is what is tested, not the decoding
SWEEP = ["model=tiny_random", "method=pld", "tree.budget=4,8", "eval.num_prompts=2", "eval.max_new_tokens=8",
         "eval.fastest_plain=false", "eval.memory_probe=false", "eval.latency_profile=false", "eval.warmup=0",
         "eval.dtype=float32", "eval.first_turn_only=true"]
LAUNCHERS = {"basic": "BasicLauncher", "joblib": "JoblibLauncher", "submitit_slurm": "SlurmLauncher",
             "ray": "RayLauncher"}


def hydra_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_every_launcher_directory_file_is_tested():
    assert {p.stem for p in (Path(CONF) / "hydra" / "launcher").glob("*.yaml")} <= LAUNCHERS.keys()


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_composes_and_instantiates(name):
    """As `python run.py -m hydra/launcher=NAME` builds it (Hydra only instantiates launchers through its plugins)."""
    cfg = hydra_cfg([f"hydra/launcher={name}", "model=tiny_random"])
    launcher = Plugins.instance().instantiate_launcher(hydra_context=HydraContext(config_loader=None, callbacks=None),
                                                       task_function=print, config=cfg)
    assert type(launcher).__name__ == LAUNCHERS[name]


def test_basic_is_the_default_launcher():
    assert hydra_cfg([]).hydra.runtime.choices["hydra/launcher"] == "basic"


def test_ray_starts_locally_unless_given_a_cluster_address():
    assert hydra_cfg(["hydra/launcher=ray"]).hydra.launcher.ray.init.address is None
    cfg = hydra_cfg(["hydra/launcher=ray", "hydra.launcher.ray.init.address=ray://head:10001"])
    assert cfg.hydra.launcher.ray.init.address == "ray://head:10001"


def sweep(args: list[str], sweep_dir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", **(env or {}))
    return subprocess.run([sys.executable, "run.py", "-m", *args, *SWEEP, f"hydra.sweep.dir={sweep_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def assert_one_row_set_per_job(sweep_dir: Path) -> None:
    jobs = sorted(p.name for p in sweep_dir.iterdir() if (p / "records.jsonl").exists())
    assert len(jobs) == 2
    table = pd.read_csv(sweep_dir / "sweep_summary.csv")
    assert sorted(table["job"].unique()) == jobs
    for job, rows in table.groupby("job"):
        assert sorted(rows["method"]) == ["plain", "pld"]  # one row per method, nothing doubled
    assert sorted(table["tree.budget"].unique()) == [4, 8]
    assert [p for p in sweep_dir.glob("sweep*.png") if p.stat().st_size > 0]  # the sweep plots


@pytest.mark.slow
def test_joblib_sweep_runs_the_jobs_in_worker_processes(tmp_path):
    proc = sweep(["hydra/launcher=joblib"], tmp_path / "sweep")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    assert_one_row_set_per_job(tmp_path / "sweep")


@pytest.mark.slow
def test_ray_sweep_runs_on_a_local_ray_instance(tmp_path):
    proc = sweep(["hydra/launcher=ray", "hydra.launcher.ray.init.num_cpus=2"], tmp_path / "sweep")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Started a local Ray instance" in proc.stdout + proc.stderr
    assert_one_row_set_per_job(tmp_path / "sweep")


@pytest.mark.slow
def test_slurm_launcher_writes_the_job_array_script_submitit_submits(tmp_path):
    """No SLURM here: stand-ins for sbatch and srun (submitit checks that srun exists) refuse to run, and the script
    submitit wrote for sbatch is read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool}: no SLURM controller on this machine" >&2\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    proc = sweep(["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"], tmp_path / "sweep",
                 {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode != 0 and "no SLURM controller" in proc.stderr
    scripts = list((tmp_path / "sweep" / ".submitit").glob(".submission_file_*.sh"))
    assert len(scripts) == 1  # one job array for the whole sweep
    script = scripts[0].read_text()
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --partition=gpu", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --job-name=specbench_eval", "#SBATCH --mem=16GB"):
        assert line in script
    assert f"{sys.executable} -u -m submitit.core._submit" in script
