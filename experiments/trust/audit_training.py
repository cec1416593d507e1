"""Issue 34's training-folder audit: reruns of `python run.py task=train` into a training folder, run as a user runs
them (Medusa heads on the tiny random model, a scratch folder and a scratch cache), against any source tree.

    python experiments/trust/audit_training.py                        # this checkout
    git archive a045f68 | tar -x -C /tmp/before && python experiments/trust/audit_training.py --tree /tmp/before

Each case prints how the run ended (audit.py's verdicts: `one line`, `uncaught error`, `exit 0`) and, where it exited 0,
what it did to the folder: the optimizer steps it trained, what the artifact's JSON now claims, whether the weights
changed. The table goes to stdout as Markdown (experiments/trust/issue34_training.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit import Audit  # noqa: E402

SMALL = ["task=train", "method=medusa", "model=tiny_random", "method.train.data.num_conversations=10",
         "method.train.data.num_val=3", "method.train.data.max_length=96", "method.train.data.batch_size=2",
         "method.train.data.self_distill=null", "method.train.epochs=1", "method.train.checkpoint_every_n_steps=1",
         "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false"]
DONE = [*SMALL, "method.train.max_steps=2"]  # the finished folder every rerun case starts from
# long enough to be killed mid-fit: 37 training conversations (256 tokens) in batches of 2, 10 steps of one epoch
LONG = [*SMALL, "method.train.data.num_conversations=40", "method.train.data.max_length=256",
        "method.train.max_steps=10"]


def state(folder: Path) -> dict:
    """The folder's trained step (train_summary.json), the artifact's weights digest and its JSON's train settings."""
    summary, meta = folder / "train_summary.json", folder / "medusa.json"
    weights = folder / "medusa.safetensors"
    return {"step": json.loads(summary.read_text())["global_step"] if summary.exists() else None,
            "digest": hashlib.sha1(weights.read_bytes()).hexdigest()[:8] if weights.exists() else None,
            "train": json.loads(meta.read_text())["train"] if meta.exists() else None}


def setting(train: dict | None, key: str):
    node = train
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


class TrainingAudit(Audit):
    def finished(self) -> Path:
        if not hasattr(self, "_made"):
            code, _, err, self._made = self.run(DONE)
            assert code == 0, err[-2000:]
        copy = Path(tempfile.mkdtemp(dir=self.scratch)) / "run"
        shutil.copytree(self._made, copy)
        return copy


def rerun(audit: TrainingAudit, override: str, key: str) -> str:
    folder = audit.finished()
    before = state(folder)
    code, _, err, _ = audit.run([*DONE, override], folder)
    verdict = audit.verdict(code, err)
    if code == 0:
        after = state(folder)
        trained = after["step"] - before["step"]
        weights = "the same weights" if after["digest"] == before["digest"] else "new weights"
        verdict += (f"; **trained {trained} more steps (step {after['step']}), {weights}, and medusa.json now says "
                    f"{key.rsplit('.', 1)[-1]}={setting(after['train'], key)!r}**")
    return verdict


def cases(audit: TrainingAudit):
    for override, key in (("method.train.module.lr=0.01", "module.lr"),
                          ("method.train.data.max_length=64", "data.max_length"),
                          ("method.train.max_steps=1", "max_steps"),
                          ("method.train.max_steps=4", "max_steps"),
                          ("method.train.module.num_heads=2", "module.num_heads")):
        yield f"rerun into a finished folder (2 steps) with {override}", rerun(audit, override, key)

    folder = audit.finished()
    code, _, err, _ = audit.run(DONE, folder)
    yield "rerun into a finished folder with the same settings", audit.verdict(code, err) + (
        f"; step {state(folder)['step']}" if code == 0 else "")

    folder = audit.finished()
    last = folder / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    code, _, err, _ = audit.run(DONE, folder)
    yield "checkpoints/last.ckpt cut to half its size, rerun", audit.verdict(code, err)

    folder = audit.finished()
    (folder / "settings.json").unlink(missing_ok=True)
    (folder / "train_summary.json").unlink()
    code, _, err, _ = audit.run([*DONE, "method.train.module.lr=0.01"], folder)
    yield "a folder with checkpoints and no settings.json, rerun with lr=0.01", audit.verdict(code, err) + (
        f"; **resumed the unknown checkpoint: step {state(folder)['step']}**" if code == 0 else "")

    folder = audit.finished()
    code, _, err, _ = audit.run([*DONE, "method.train.module.lr=0.01", "method.train.resume=false"], folder)
    moved = sorted(p.name for p in (folder / "earlier").glob("*/*")) if (folder / "earlier").exists() else []
    yield "rerun with lr=0.01 and method.train.resume=false", audit.verdict(code, err) + (
        f"; trained from step 0 to {state(folder)['step']}, medusa.json says lr="
        f"{setting(state(folder)['train'], 'module.lr')}, the earlier run kept in earlier/<time>/ "
        f"({', '.join(moved)})" if code == 0 else "")

    code, _, err, folder = audit.run([*SMALL, "method.train.max_steps=0"])
    written = [p.name for p in folder.glob("medusa.*")]
    said = next((line.split(" - ", 1)[-1] for line in err.splitlines() if "trained nothing" in line), "")
    yield "method.train.max_steps=0", audit.verdict(code, err) + (
        f"; **untrained heads exported: {', '.join(written)}**" if written else f"; no artifact; log: `{said[:130]}`"
        if code == 0 else "")

    yield killed_and_rerun(audit)


def killed_and_rerun(audit: TrainingAudit) -> tuple[str, str]:
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    proc = audit.run(LONG, folder, wait=False)
    last = folder / "checkpoints" / "last.ckpt"
    while not last.exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # a no-op if it already ended
    proc.communicate()
    killed = sorted(p.name for p in (folder / "checkpoints").glob("epoch=*.ckpt"))
    unfinished = not (folder / "medusa.safetensors").exists()
    code, _, err, _ = audit.run(LONG, folder)
    restored = "Restoring states from the checkpoint path" in err
    metrics = folder / "logs" / "metrics.csv"
    first = None
    if metrics.exists():
        rows = [line.split(",") for line in metrics.read_text().splitlines()]
        col = rows[0].index("step")
        first = min(int(float(row[col])) for row in rows[1:] if row[col])
    return "killed (SIGKILL) once last.ckpt exists, rerun with the same settings", audit.verdict(code, err) + (
        f"; killed {'mid-fit' if unfinished else 'after the fit'} ({', '.join(killed)}), "
        f"{'resumed from last.ckpt' if restored else '**started over**'} (the rerun's first logged step {first}), "
        f"finished at step {state(folder)['step']} of 10" if code == 0 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--killed-only", action="store_true", help="only the SIGKILL-and-rerun case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        audit = TrainingAudit(args.tree.resolve(), Path(scratch))
        print("| case | how it ended |\n|---|---|")
        for case, verdict in [killed_and_rerun(audit)] if args.killed_only else cases(audit):
            print(f"| {case} | {verdict} |", flush=True)


if __name__ == "__main__":
    main()
