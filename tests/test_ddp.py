"""Rank-safe training under DDP on the CPU (gloo): the validation accuracy is summed over ranks before it is read,
and a 2-process `task=train` makes its self-distillation data once and writes its artifact from rank 0 only."""

import pytest
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specbench.training.base import RankAccuracy

pytestmark = pytest.mark.slow  # multi-process / notebook kernel: seconds each (README: the fast subset)

ROOT = Path(__file__).resolve().parents[1]


def shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's validation logits and labels: different sizes and contents per rank."""
    gen = torch.Generator().manual_seed(rank)
    n = 7 + 5 * rank
    return torch.randn(n, 16, generator=gen), torch.randint(0, 16, (n,), generator=gen)


def _rank_accuracy_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    metric = RankAccuracy(groups=2, ranks=4)
    logits, labels = shard(rank)
    metric.update(rank, logits, labels)  # each rank fills its own group too: both groups must be gathered
    Path(out, f"{rank}.json").write_text(json.dumps({"probs": metric.rank_probs(), "top1": metric.topk(0, 1)}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_rank_accuracy_is_the_all_reduced_count(tmp_path):
    mp.spawn(_rank_accuracy_worker, args=(2, 29500 + os.getpid() % 1000, str(tmp_path)), nprocs=2)
    alone = RankAccuracy(groups=2, ranks=4)  # one process that saw every rank's data
    for rank in range(2):
        alone.update(rank, *shard(rank))
    local = RankAccuracy(groups=2, ranks=4)
    local.update(0, *shard(0))
    for rank in range(2):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert got["probs"] == alone.rank_probs() and got["top1"] == alone.topk(0, 1)
    assert local.rank_probs() != alone.rank_probs()  # so a rank's own shard would have been caught


@pytest.mark.slow
def test_two_process_ddp_training_writes_once(tmp_path):
    n = 12
    args = [sys.executable, "run.py", "task=train", "method=draft_model", "model=tiny_random", "trainer=ddp",
            "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32", "method.train.module.num_layers=1",
            f"method.train.data.num_conversations={n}", "method.train.data.num_val=4",
            "method.train.data.max_length=96", "method.train.data.batch_size=2", "method.train.max_steps=2",
            "method.train.data.self_distill.max_new_tokens=8", "method.train.data.self_distill.max_prompt_tokens=32",
            "method.train.data.self_distill.dtype=float32", f"hydra.run.dir={tmp_path}/run"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", SPECBENCH_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out  # the second rank really trained
    caches = list((tmp_path / "cache" / "training").glob("selfdistill-*.jsonl"))
    assert len(caches) == 1 and len(caches[0].read_text().splitlines()) == n  # generated once, not per rank
    assert out.count('"artifact":') == 1  # rank 0 alone saved the artifact and printed the summary
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and Path(summary["artifact"]).exists()
    meta = json.loads(Path(summary["artifact"]).with_suffix(".json").read_text())
    assert meta["metrics"]["val/top1"] == sum(meta["metrics"]["rank_accuracy"][0][:1])
