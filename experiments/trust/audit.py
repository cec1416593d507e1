"""Issue 18's hostile-user audit: every bad input and corrupted run folder, run as a user runs it (`python run.py`
on the tiny random model, in a scratch folder and a scratch cache), against any source tree.

    python experiments/trust/audit.py                       # this checkout
    python experiments/trust/audit.py --tree /tmp/before    # e.g. a worktree of the commit before issue 18

Each case prints how the run ended: `one line` (exit 2, one `error:` line, no traceback), `uncaught error` (a traceback or
Hydra's error dump), or `exit 0`, and for cases where exit 0 is the bug, what the run silently got wrong. The table goes to stdout as
Markdown. It is an audit of the command line, not an evaluation: nothing here times or scores decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8", "eval.warmup=0",
       "eval.memory_probe=false", "eval.fastest_ar=false", "eval.latency_profile=false", "eval.first_turn_only=true"]
TWO = [*RUN, "methods=[pld,{method:pld,label:pld-3,overrides:['tree.budget=3']}]"]


class Audit:
    def __init__(self, tree: Path, scratch: Path) -> None:
        self.tree, self.scratch = tree, scratch
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", PYTHONPATH=str(tree),
                        SPECBENCH_CACHE=str(scratch / "cache"), OMP_NUM_THREADS="2")

    def run(self, args: list[str], folder: Path | None | bool = None, wait: bool = True):
        """folder: the run folder (None: a new one; False: Hydra's default under outputs/ in the scratch dir)."""
        if folder is None:
            folder = Path(tempfile.mkdtemp(dir=self.scratch))
        cmd = [sys.executable, str(self.tree / "run.py"), *args] + ([f"hydra.run.dir={folder}"] if folder else [])
        proc = subprocess.Popen(cmd, cwd=self.scratch, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        if not wait:
            return proc
        out, err = proc.communicate(timeout=600)
        return proc.returncode, out, err, folder

    @staticmethod
    def verdict(code: int, err: str) -> str:
        lines = [line for line in err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        if "Traceback" in err or "HYDRA_FULL_ERROR" in err:  # Hydra prints an uncaught error, then this hint
            shown = [line for line in lines if "HYDRA_FULL_ERROR" not in line and not line.startswith(" ")]
            return f"uncaught error, exit {code}: `{shown[-1].strip()[:110] if shown else ''}`"
        if code == 2 and len(errors) == 1:
            return f"one line: `{errors[0][7:][:140]}`"
        if code == 0:
            return "exit 0"
        return f"exit {code}: `{lines[-1][:100] if lines else ''}`"

    def finished(self) -> Path:
        """A finished run folder (autoregressive, pld, pld-3 on 2 prompts), copied for each case to damage."""
        if not hasattr(self, "_made"):
            code, _, err, self._made = self.run(TWO)
            assert code == 0, err[-2000:]
        copy = Path(tempfile.mkdtemp(dir=self.scratch)) / "run"
        shutil.copytree(self._made, copy)
        return copy


def records(folder: Path) -> list[dict]:
    path = folder / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def summary_labels(folder: Path) -> list[str]:
    path = folder / "summary.json"
    return [row["method"] for row in json.loads(path.read_text())] if path.exists() else []


def cases(audit: Audit, data: Path):
    """(case, how it ended, what exit 0 got wrong or '')."""
    simple = [
        ("eval.num_prompts=abc", ["eval.num_prompts=abc"]),
        ("eval.max_new_tokens=100000", ["eval.max_new_tokens=100000"]),
        ("sampling.temperature=hot", ["sampling.temperature=hot"]),
        ("sampling.temperature=nan", ["sampling.temperature=nan"]),
        ("sampling.temperature=inf", ["sampling.temperature=inf", "sampling=sample", "accept=rejection"]),
        ("dataset=jsonl without dataset.path", ["dataset=jsonl"]),
        ("dataset.path a directory", ["dataset=jsonl", f"dataset.path={data}"]),
        ("dataset.path not UTF-8", ["dataset=jsonl", f"dataset.path={data}/latin1.jsonl"]),
        ("model=hf without model.path", ["model=hf"]),
        ("model=hf, model.path a folder without config.json", ["model=hf", f"model.path={data}"]),
        ("tree.budget=abc", ["tree.budget=abc"]),
        ("hw.num_threads=abc", ["hw.num_threads=abc"]),
        ("method.drafter.max_ngram=abc", ["method.drafter.max_ngram=abc"]),
        ("eval.profile_backends=[] (meant every backend)", ["eval.profile_backends=[]", "eval.fastest_ar=true"]),
    ]
    for name, args in simple:
        args = [*RUN, *[a for a in args if not a.startswith("eval.fastest_ar")], *[a for a in args
                                                                                if a.startswith("eval.fastest_ar")]]
        code, _, err, folder = audit.run(args)
        wrong = ""
        if code == 0:
            wrong = "accepted: ran with it"
        yield name, audit.verdict(code, err), wrong

    code, _, err, folder = audit.run([*RUN, "dataset=jsonl", f"dataset.path={data}/dup.jsonl",
                                      "eval.num_prompts=5"])
    got = len({r["question_id"] for r in records(folder)})
    yield ("JSONL with repeated question_ids (5 lines, 3 ids)", audit.verdict(code, err),
           f"decoded {got} of 5 prompts, no word" if code == 0 else "")

    # --- a finished run folder, damaged, then the same command again ---
    folder = audit.finished()
    (folder / "settings.json").write_text('{"shared": {')
    code, _, err, _ = audit.run(TWO, folder)
    yield "settings.json cut short", audit.verdict(code, err), ""

    folder = audit.finished()
    with (folder / "records.jsonl").open("a") as fh:
        fh.write("garbage that is not JSON\n")
    code, _, err, _ = audit.run(TWO, folder)
    yield ("a garbage line inside records.jsonl", audit.verdict(code, err),
           "the damaged line was passed over without a word" if code == 0 else "")

    folder = audit.finished()
    rows = records(folder)
    rows[1]["settings_hash"] = "0" * len(rows[1]["settings_hash"])
    rows[1]["output_ids"] = [1, 2, 3]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err, _ = audit.run(TWO, folder)
    kept = any(r.get("output_ids") == [1, 2, 3] for r in records(folder))
    yield ("a record made under other settings", audit.verdict(code, err),
           "the foreign record was summarised" if code == 0 and kept else "")

    folder = audit.finished()
    rows = records(folder)
    ghost = dict(rows[1], method="ghost", wall_time=1e-4)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, ghost]))
    code, _, err, _ = audit.run(TWO, folder)
    yield ("a record of a label not in the run", audit.verdict(code, err),
           "a 'ghost' row in the summary" if code == 0 and "ghost" in summary_labels(folder) else "")

    folder = audit.finished()
    (folder / "settings.json").unlink()
    other = [*TWO[:-1], "eval.max_new_tokens=6", TWO[-1]]
    code, _, err, _ = audit.run(other, folder)
    reused = code == 0 and len(records(folder)) == 6
    yield ("settings.json deleted, rerun with other settings", audit.verdict(code, err),
           "old records (8 tokens) reused for a 6-token run" if reused else "")

    folder = audit.finished()
    rows = records(folder)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[2]]))
    code, _, err, _ = audit.run(TWO, folder)
    yield ("a duplicated record", audit.verdict(code, err),
           "the duplicate was summarised twice" if code == 0 else "")

    code, _, err, folder = audit.run([*RUN, "methods=[{method:pld,label:autoregressive}]"])
    yield ("a method labelled `autoregressive`", audit.verdict(code, err),
           "PLD's records stood in for the baseline" if code == 0 else "")

    code, _, err, _ = audit.run([*RUN, "methods=[{method:pld,label:/../../../escaped}]"], folder=False)
    escaped = sorted(audit.scratch.glob("escaped*"))
    yield ("a label `/../../../escaped` (the default run folder's name holds it)", audit.verdict(code, err),
           f"run folder made outside outputs/: {escaped[0].name}" if escaped else "")

    # two runs into one folder at the same time
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    slow = [*RUN, "eval.num_prompts=10", "eval.max_new_tokens=96"]
    first = audit.run(slow, folder, wait=False)
    time.sleep(2.0)
    second = audit.run(slow, folder, wait=False)
    out2, err2 = second.communicate(timeout=600)
    first.communicate(timeout=600)
    keys = [(r["method"], r["question_id"], r["turn"]) for r in records(folder)]
    dup = len(keys) - len(set(keys))
    yield ("two runs into one folder at once (the second)", audit.verdict(second.returncode, err2),
           f"both exited 0; {dup} duplicated records" if second.returncode == 0 and first.returncode == 0 else "")

    # a killed run, then the same command again
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    proc = audit.run(slow, folder, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and len(records(folder)) < 3:
        time.sleep(0.05)
    proc.kill()
    proc.communicate()
    before = len(records(folder))
    code, _, err, _ = audit.run(slow, folder)
    keys = [(r["method"], r["question_id"], r["turn"]) for r in records(folder)]
    dup = len(keys) - len(set(keys))
    yield (f"killed after {before} records, rerun", audit.verdict(code, err) + f", {len(keys)} records",
           f"{dup} duplicated records" if dup else "")

    # the machine profile's cache, cut short
    code, _, err, _ = audit.run([*RUN, "eval.dtype=auto", "model.backend=auto"])
    profiles = sorted((audit.scratch / "cache" / "profiles").glob("*tiny_random*.json"))
    if profiles:
        profiles[0].write_text(profiles[0].read_text()[:200])
        code, out, err, _ = audit.run([*RUN, "eval.dtype=auto", "model.backend=auto"])
        notice = [line for line in (out + err).splitlines() if "profile" in line.lower() and "measur" in line.lower()]
        yield ("machine-profile cache cut short", audit.verdict(code, err)
               + (f"; notice: `{notice[0][:120]}`" if code == 0 and notice else ""), "")
    else:
        yield "machine-profile cache cut short", f"no profile was written ({audit.verdict(code, err)})", ""

    # SSSD's datastore: cut short, and token ids beyond the vocabulary
    store = audit.scratch / "store.npz"
    code, _, err, _ = audit.run(["task=datastore", "model=tiny_random", "datastore.num_conversations=20",
                                 f"datastore.path={store}"])
    if store.exists():
        cut = audit.scratch / "cut.npz"
        cut.write_bytes(store.read_bytes()[: store.stat().st_size // 2])
        code, _, err, _ = audit.run([*RUN, "method=sssd", f"datastore.path={cut}"])
        yield "SSSD datastore cut short", audit.verdict(code, err), ""
        import numpy as np

        with np.load(store, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["tokens"] = arrays["tokens"].copy()
        arrays["tokens"][: len(arrays["tokens"]) // 2] = np.iinfo(arrays["tokens"].dtype).max - 1  # past any vocabulary here
        oov = audit.scratch / "oov.npz"
        np.savez(oov, **arrays)
        code, _, err, _ = audit.run([*RUN, "method=sssd", f"datastore.path={oov}"])
        yield "SSSD datastore with token ids beyond the vocabulary", audit.verdict(code, err), (
            "decoded with ids the model does not have" if code == 0 else "")
    else:
        yield "SSSD datastore", f"could not build one ({audit.verdict(code, err)})", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        data = scratch / "data"
        data.mkdir()
        rows = [{"question_id": q, "turns": [f"question {i}"]} for i, q in enumerate("abacb")]
        (data / "dup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (data / "latin1.jsonl").write_bytes('{"question_id": "a", "turns": ["caf\u00e9"]}\n'.encode("latin-1"))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.tree, capture_output=True,
                                text=True).stdout.strip()
        print(f"| case | how it ended at {commit} | what exit 0 got wrong |\n|---|---|---|")
        for name, how, wrong in cases(Audit(args.tree.resolve(), scratch), data):
            print(f"| {name} | {how} | {wrong} |", flush=True)


if __name__ == "__main__":
    main()
