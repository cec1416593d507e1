"""The multirun sweep summary: every job's summary in one table with its swept settings, and a plot against them;
a rerun of a sweep resumes it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specbench.reporting.sweep import sweep_summary

ROOT = Path(__file__).resolve().parents[1]


def test_sweep_summary_joins_the_jobs_with_their_swept_settings(tmp_path):
    for job, b in enumerate((1, 4)):
        folder = tmp_path / f"{job}_eval.batch_size={b}"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(f"- eval.batch_size={b}\n- experiment=seeds/sssd_batch\n")
        pd.DataFrame({"method": ["plain", "pld"], "tau": [1.0, 1.3], "tokens_per_s": [10.0, 12.0 / b],
                      "throughput_tokens_per_s": [10.0 * b, 12.0], "throughput_speedup": [1.0, 1.2 / b],
                      "model": "m", "hw": "cpu", "dtype": "float32", "dataset": "d", "num_prompts": 4,
                      "cpu_capability": "AVX2"}).to_csv(folder / "summary.csv", index=False)
    table = sweep_summary(tmp_path)
    saved = pd.read_csv(tmp_path / "sweep_summary.csv")
    assert len(table) == len(saved) == 4 and sorted(saved["eval.batch_size"].unique()) == [1, 4]
    assert "experiment" not in saved  # only what was swept
    pld = saved[saved["method"] == "pld"].set_index("eval.batch_size")
    assert pld.loc[4, "throughput_speedup"] == 0.3
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_a_job_whose_overrides_hold_a_path_is_found_in_its_nested_folder(tmp_path):
    """Hydra names a job's folder by its overrides, so replay.run=runs/a puts it two folders deep."""
    for job, b in enumerate((4, 8)):
        folder = tmp_path / f"{job}_replay.run=runs" / f"a,tree.budget={b}"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(f"- replay.run=runs/a\n- tree.budget={b}\n")
        pd.DataFrame({"method": ["sssd"], "tau": [1.5 + b / 8]}).to_csv(folder / "summary.csv", index=False)
    saved = sweep_summary(tmp_path)
    assert saved["tree.budget"].tolist() == ["4", "8"] and saved["tau"].tolist() == [2.0, 2.5]
    assert saved["job"].tolist() == ["0_replay.run=runs/a,tree.budget=4", "1_replay.run=runs/a,tree.budget=8"]
    assert not (tmp_path / "sweep.png").exists()  # tau alone: no speedup to plot


def test_a_job_folder_written_before_plain_decoding_had_one_name_reads_under_it(tmp_path):
    """Old summaries name plain decoding `autoregressive` and carry fastest_ar, fastest_ar_any and
    speedup_vs_baseline: the sweep table reads them under today's names, beside a new job's."""
    old = {"method": ["autoregressive", "autoregressive@eager", "pld"], "tau": [1.0, 1.0, 1.4],
           "fastest_ar": ["autoregressive"] * 3, "fastest_ar_any": ["autoregressive@eager"] * 3,
           "speedup_vs_baseline": [1.0, 0.5, 1.3]}
    new = {"method": ["plain", "pld"], "tau": [1.0, 1.5], "fastest_plain": ["plain"] * 2,
           "fastest_plain_any": ["plain"] * 2, "speedup_vs_own_plain": [1.0, 1.2]}
    for job, (b, frame) in enumerate(((4, old), (8, new))):
        folder = tmp_path / f"{job}_tree.budget={b}"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(f"- tree.budget={b}\n")
        pd.DataFrame(frame).to_csv(folder / "summary.csv", index=False)
    saved = sweep_summary(tmp_path)
    assert not {"fastest_ar", "fastest_ar_any", "speedup_vs_baseline"} & set(saved)
    assert saved["method"].tolist() == ["plain", "plain@eager", "pld", "plain", "pld"]
    assert saved["fastest_plain_any"].tolist() == ["plain@eager"] * 3 + ["plain"] * 2
    assert saved["speedup_vs_own_plain"].tolist() == [1.0, 0.5, 1.3, 1.0, 1.2]


def test_a_sweep_without_summaries_writes_nothing(tmp_path):
    assert sweep_summary(tmp_path) is None and not (tmp_path / "sweep_summary.csv").exists()


@pytest.mark.slow
def test_rerunning_a_sweep_skips_finished_jobs_and_duplicates_nothing(tmp_path):
    """A sweep killed while its second job decoded, rerun with the same command and sweep folder: each job lands in
    the same sub-folder (hydra.sweep.subdir is its number and overrides), finished prompts are not decoded again,
    the cut job completes, and every table holds each (job, method, prompt) once."""
    sweep_dir = tmp_path / "sweep"
    args = [sys.executable, "run.py", "-m", "model=tiny_random", "method=pld", "tree.budget=4,8",
            "eval.num_prompts=2", "eval.max_new_tokens=8", "eval.first_turn_only=true", "eval.dtype=float32",
            "eval.fastest_plain=false", "eval.memory_probe=false", "eval.latency_profile=false", "eval.warmup=0",
            f"hydra.sweep.dir={sweep_dir}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    first = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    finished, cut = sorted(p for p in sweep_dir.iterdir() if (p / "records.jsonl").exists())
    finished_records = (finished / "records.jsonl").read_text()
    lines = (cut / "records.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 4  # 2 prompts x (plain, pld)
    (cut / "records.jsonl").write_text("".join(lines[:2]) + lines[2][:40])  # killed while writing prompt 2
    (cut / "summary.csv").unlink()

    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (finished / "records.jsonl").read_text() == finished_records  # nothing decoded again
    redone = (cut / "records.jsonl").read_text().splitlines(keepends=True)
    assert redone[:2] == lines[:2]  # prompt 1 kept as it was, prompt 2 decoded anew
    keys = [(r["method"], r["question_id"], r["turn"]) for r in map(json.loads, redone)]
    assert len(keys) == len(set(keys)) == 4
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == sorted([finished.name, cut.name])
    table = pd.read_csv(sweep_dir / "sweep_summary.csv")
    assert table.groupby("job")["method"].apply(sorted).tolist() == [["plain", "pld"]] * 2
