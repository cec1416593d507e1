"""Every published checkpoint layout, run as a user runs it: `python run.py model=tiny_random method=...
method.checkpoint=<folder>` plans, fits, prices, decodes and summarises, and its tokens equal plain decoding in fp32
(lossless_match 1.0). A checkpoint that is not the run's (another base model, a head count it lacks, a draft vocabulary
map out of range) ends as one `error:` line, exit 2, before anything decodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.models.tiny import tiny_random

from .test_published import eagle1_state, eagle3_folder, eagle_config, medusa_folder, ppd_folder, write

ROOT = Path(__file__).resolve().parents[1]
RUN = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8", "eval.warmup=0",
       "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false", "eval.first_turn_only=true"]
ACCURACY = "[[0.6,0.2,0.1],[0.4,0.2,0.1],[0.3,0.1,0.1]]"  # a published checkpoint carries none: the run gives them


def target_of(num_layers: int):
    """The model `model=tiny_random model.num_layers=N` builds (the same seed, so the same embedding)."""
    return tiny_random(num_layers=num_layers)


def eagle1(folder: Path) -> list[str]:
    target = target_of(2)
    config = eagle_config(target.model.config, layers=1)
    write(folder, config, "pytorch_model.bin",
          eagle1_state(target.model.config, config, target.model.get_input_embeddings().weight.detach()))
    return ["method=eagle"]


def eagle3(folder: Path, **state) -> list[str]:
    """EAGLE-3 fuses layers 2, L//2 and L-3: three distinct ones need L >= 7."""
    target = target_of(8)
    vocab = target.model.config.vocab_size
    draft_ids = sorted(torch.randperm(vocab, generator=torch.Generator().manual_seed(4))[:160].tolist())
    eagle3_folder(folder, target, draft_ids, "model.safetensors")
    if state:  # a damaged map written over the good one
        from safetensors.torch import load_file, save_file

        save_file(load_file(str(folder / "model.safetensors")) | state, str(folder / "model.safetensors"))
    return ["method=eagle", "model.num_layers=8"]


def medusa(folder: Path, name: str = "medusa_lm_head.safetensors", **kwargs) -> list[str]:
    medusa_folder(folder, target_of(2), 1, name, **kwargs)
    return ["method=medusa", "tree=greedy", f"tree.accept_prob={ACCURACY}", "tree.budget=6"]


def ppd(folder: Path) -> list[str]:
    ppd_folder(folder, target_of(2), m=3, members=1)
    return ["method=ppd", f"method.drafter.accept_prob={ACCURACY}", "tree.budget=16"]


LAYOUTS = {"eagle1": eagle1, "eagle3": eagle3, "medusa1": medusa,
           "medusa2": lambda folder: medusa(folder, "model.safetensors"), "ppd": ppd}


def run(args: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "run.py", *RUN, *args, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.slow
def test_a_published_layout_runs_end_to_end_losslessly(tmp_path, layout):
    folder = tmp_path / layout
    args = LAYOUTS[layout](folder)
    proc = run([*args, f"method.checkpoint={folder}"], tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["method"]: row for row in json.loads((tmp_path / "run" / "summary.json").read_text())}
    method = args[0].removeprefix("method=")
    assert method in rows, sorted(rows)
    assert rows[method]["num_prompts"] == 2 and rows[method]["lossless_match"] == 1.0
    assert rows[method]["tau"] >= 1.0 and rows[method]["drafter_params"] > 0


def _negative_d2t(folder: Path) -> list[str]:
    args = eagle3(folder)
    from safetensors.torch import load_file

    offsets = load_file(str(folder / "model.safetensors"))["d2t"].clone()
    offsets[5] = -(5 + 1)  # draft id 5 -> target id -1: indexes from the end of the vocabulary
    eagle3(folder, d2t=offsets)
    return args


def _d2t_past_the_vocabulary(folder: Path) -> list[str]:
    args = eagle3(folder)
    from safetensors.torch import load_file

    offsets = load_file(str(folder / "model.safetensors"))["d2t"].clone()
    offsets[-1] += 1000
    eagle3(folder, d2t=offsets)
    return args


def _t2d_other_ids(folder: Path) -> list[str]:
    args = eagle3(folder)
    vocab = target_of(8).model.config.vocab_size
    eagle3(folder, t2d=torch.ones(vocab, dtype=torch.bool))
    return args


def _medusa_fewer_heads_than_asked(folder: Path) -> list[str]:
    return [*medusa(folder, heads=2), "method.drafter.num_heads=4"]


def _medusa_of_another_base_model(folder: Path) -> list[str]:
    args = medusa(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    return args


def _ppd_of_another_base_model(folder: Path) -> list[str]:
    args = ppd(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    other = config | {"base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    (folder / "adapter_config.json").write_text(json.dumps(other))
    return args


MISMATCHES = {
    "negative d2t": (_negative_d2t, "sends the 160 draft ids to target ids -1..", "0..258"),
    "d2t past the vocabulary": (_d2t_past_the_vocabulary, "to target ids", "in 0..258"),
    "t2d flags other ids": (_t2d_other_ids, "its t2d flags 259 target ids", "exactly the target ids d2t maps to"),
    "medusa: 4 heads asked, 2 held": (_medusa_fewer_heads_than_asked, "method.drafter.num_heads=4 is invalid",
                                      "holds 2 heads, so give an integer in 1..2"),
    "medusa: another base model": (_medusa_of_another_base_model, "trained for base model 'lmsys/vicuna-7b-v1.3'",
                                   "but the target is 'tiny_random'"),
    "ppd: another base model": (_ppd_of_another_base_model, "trained for base model 'lmsys/vicuna-7b-v1.3'",
                                "but the target is 'tiny_random'"),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
@pytest.mark.slow
def test_a_checkpoint_that_is_not_the_runs_is_one_line(tmp_path, case):
    make, *expected = MISMATCHES[case]
    folder = tmp_path / "ckpt"
    proc = run([*make(folder), f"method.checkpoint={folder}"], tmp_path / "run")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    assert all(text in errors[0] for text in expected), errors[0]
    assert not (tmp_path / "run" / "records.jsonl").exists()  # refused before anything decoded
