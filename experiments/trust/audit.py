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
       "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false", "eval.first_turn_only=true"]
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
        """A finished run folder (plain, pld, pld-3 on 2 prompts), copied for each case to damage."""
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
        ("eval.profile_backends=[] (meant every backend)", ["eval.profile_backends=[]", "eval.fastest_plain=true"]),
    ]
    for name, args in simple:
        args = [*RUN, *[a for a in args if not a.startswith("eval.fastest_plain")], *[a for a in args
                                                                                if a.startswith("eval.fastest_plain")]]
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

    code, _, err, folder = audit.run([*RUN, "methods=[{method:pld,label:plain}]"])
    yield ("a method labelled `plain`", audit.verdict(code, err),
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


# --- issue 34: run folders, caches and the command line (python audit.py --issue34 [--tree T]) ---

PROFILE = [*RUN, "eval.dtype=auto", "model.backend=auto", "eval.profile_backends=[eager]", "eval.profile_weights=[fp]"]
SLOW = [*RUN, "eval.num_prompts=10", "eval.max_new_tokens=96"]


def interrupted(code: int, err: str) -> str:
    """Ctrl-C: exit 130 and one `error:` line is the goal; Hydra's dump or a traceback is not."""
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if code == 130 and len(errors) == 1 and "Traceback" not in err:
        return f"one line, exit 130: `{errors[0][7:][:200]}`"
    return Audit.verdict(code, err).replace("exit 1:", f"exit {code}:")


def whole_lines(folder: Path) -> str:
    path = folder / "records.jsonl"
    if not path.exists():
        return "no records.jsonl"
    data = path.read_bytes()
    cut = bool(data) and not data.endswith(b"\n")
    whole = data.count(b"\n")
    return f"{whole} whole records" + (", **a cut line at the end**" if cut else "")


def mounted(point: Path, size: str, read_only: bool = False) -> bool:
    """A tmpfs of `size` at point (root only), read-only if asked: a full or read-only disk for real."""
    point.mkdir(parents=True, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)]).returncode == 0
    if ok and read_only:
        ok = subprocess.run(["mount", "-o", "remount,ro", str(point)]).returncode == 0
    return ok


def issue34_cases(audit: Audit, data: Path):
    """(case, how it ended, what it got silently wrong or '')."""
    env = dict(audit.env)

    def with_env(**changes):
        audit.env = {k: v for k, v in {**env, **changes}.items() if v is not None}

    # 1. records written through a symlink
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    folder.mkdir()
    outside = audit.scratch / "outside.jsonl"
    outside.write_text("")
    (folder / "records.jsonl").symlink_to(outside)
    code, _, err, _ = audit.run(RUN, folder)
    n = outside.read_text().count("\n")
    yield ("records.jsonl a symlink to a file outside the folder", audit.verdict(code, err),
           f"{n} records appended to {outside}, outside the run folder" if n else "")

    # 2. two first runs on a fresh cache, at once
    with_env(SPECBENCH_CACHE=str(audit.scratch / "fresh_cache"))
    procs = [audit.run(PROFILE, wait=False) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    measured = [o for o, _ in outs if "measuring this machine's profile" in o]
    l1 = [line.split("L(1)")[1].split("ms")[0].strip() for o, _ in outs for line in o.splitlines() if "L(1)" in line]
    waited = any("waiting for another process" in o for o, _ in outs)
    how = f"exit {procs[0].returncode} and {procs[1].returncode}; {len(measured)} of 2 measured the profile" + (
        f" (L(1) {' and '.join(l1)} ms)" if l1 else "") + ("; the second waited and read the first's" if waited else "")
    yield ("two first runs at once on a fresh cache (eval.dtype=auto model.backend=auto)", how,
           "both measured side by side, and the contended numbers were cached" if len(measured) == 2 else "")
    with_env()

    # 3. caches and run folders that cannot be written
    cache_file = audit.scratch / "cache_file"
    cache_file.write_text("a file, not a folder")
    with_env(SPECBENCH_CACHE=str(cache_file))
    code, _, err, _ = audit.run(PROFILE)
    yield "SPECBENCH_CACHE a file (a run that profiles)", audit.verdict(code, err), ""
    ro = audit.scratch / "ro_cache"
    if mounted(ro, "1m", read_only=True):
        with_env(SPECBENCH_CACHE=str(ro))
        code, _, err, _ = audit.run(PROFILE)
        yield "SPECBENCH_CACHE read-only (a run that profiles)", audit.verdict(code, err), ""
        subprocess.run(["umount", str(ro)])
    with_env()
    ro = audit.scratch / "ro_run"
    if mounted(ro, "1m", read_only=True):
        code, _, err, _ = audit.run(RUN, ro)
        yield "a read-only run folder", audit.verdict(code, err), ""
        subprocess.run(["umount", str(ro)])
    small = audit.scratch / "small_disk"
    if mounted(small, "96k"):
        folder = small / "run"
        code, _, err, _ = audit.run(SLOW, folder)
        kept = whole_lines(folder)
        subprocess.run(["mount", "-o", "remount,size=8m", str(small)])  # space freed
        again, _, err2, _ = audit.run(SLOW, folder)
        keys = [(r["method"], r["question_id"], r["turn"]) for r in records(folder)]
        yield ("a full disk while decoding (96 KiB tmpfs), then space freed and the same command again",
               audit.verdict(code, err) + f"; {kept}; rerun: exit {again}, {len(keys)} records, "
               f"{len(keys) - len(set(keys))} duplicated",
               "" if again == 0 else f"the rerun failed: {audit.verdict(again, err2)}")
        subprocess.run(["umount", str(small)])

    # Ctrl-C while decoding, then the rerun the message gives (or the same command into the same folder)
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    cmd = [sys.executable, str(audit.tree / "run.py"), *SLOW, f"hydra.run.dir={folder}"]
    proc = subprocess.Popen(cmd, cwd=audit.scratch, env=audit.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(records(folder)) < 3:
        time.sleep(0.05)
    os.killpg(proc.pid, 2)  # SIGINT to the foreground group, as a terminal's Ctrl-C
    _, err = proc.communicate(timeout=300)
    before = len(records(folder))
    code, _, err2, _ = audit.run(SLOW, folder)
    keys = [(r["method"], r["question_id"], r["turn"]) for r in records(folder)]
    yield (f"Ctrl-C after {before} records, then the same command into the folder", interrupted(proc.returncode, err)
           + f"; rerun: exit {code}, {len(keys)} records, {len(keys) - len(set(keys))} duplicated", "")

    code, _, err, _ = audit.run(["task=report", f"report.run={audit.scratch / 'no_such_run'}"])
    yield "task=report report.run=<a folder that does not exist>", audit.verdict(code, err), ""

    netrc = audit.scratch / "empty_netrc"
    netrc.write_text("")
    with_env(WANDB_MODE=None, WANDB_API_KEY=None, NETRC=str(netrc))
    code, _, err, folder = audit.run([*RUN, "logger=wandb", "logger.offline=false"])
    n = len(records(folder))
    yield ("logger=wandb logger.offline=false without a W&B API key", audit.verdict(code, err),
           f"failed after decoding {n} records" if n else "")
    with_env()

    # the GGUF's converted copy in the cache, cut short (SmolLM2-135M: eager, SDPA, fp32, so nothing is profiled)
    smol = ["model=smollm2_135m", "model.backend=eager", "model.attention=sdpa", *RUN[1:]]
    code, _, err, _ = audit.run(smol)
    copies = sorted((audit.scratch / "cache" / "models").glob("smollm2_135m-*/model.safetensors"))
    if copies:
        copies[0].write_bytes(copies[0].read_bytes()[: copies[0].stat().st_size // 3])
        code, out, err, _ = audit.run(smol)
        notice = [line for line in out.splitlines() if line.startswith("notice:")]
        yield ("GGUF cache: converted model.safetensors cut short", audit.verdict(code, err)
               + (f"; notice: `{notice[0][:140]}`" if code == 0 and notice else ""), "")
    else:
        yield "GGUF cache: converted model.safetensors cut short", f"no copy made ({audit.verdict(code, err)})", ""

    # 4. misleading messages
    cut = audit.scratch / "cut_store.npz"
    cut.write_bytes(b"PK\x03\x04 cut short")
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    code, _, err, _ = audit.run([*RUN, "method=sssd", f"datastore.path={cut}"], folder)
    left = (folder / "settings.json").exists()
    code2, _, err2, _ = audit.run([*RUN, "method=sssd", "method.drafter.sources=[input]"], folder)
    yield ("SSSD refused (datastore cut short), then rerun without the datastore into the same folder",
           audit.verdict(code, err) + f"; then: {audit.verdict(code2, err2)}",
           "the refused run left settings.json, which refused the corrected rerun" if left and code2 else "")

    rows = [{"question_id": q, "turns": [f"question {q}"]} for q in "ab"]
    (data / "array.jsonl").write_text(json.dumps(rows))
    (data / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    (data / "empty.jsonl").write_text("")
    for name, args in [("dataset.path a JSON array (not JSONL)", [f"dataset.path={data}/array.jsonl"]),
                       ("dataset.path JSONL with a UTF-8 byte-order mark", [f"dataset.path={data}/bom.jsonl"]),
                       ("dataset.path an empty file", [f"dataset.path={data}/empty.jsonl"])]:
        code, out, err, folder = audit.run([*RUN, "dataset=jsonl", *args])
        loaded = "backend/dtype" in out + err or (folder / "specbench.log").exists() and "backend/dtype" in (
            folder / "specbench.log").read_text()
        yield name, audit.verdict(code, err) + ("; the model loaded first" if code and loaded else ""), ""

    for name, args in [("model.weights=int4 model.group_size=256 (tiny hidden size 64)",
                        ["model.weights=int4", "model.group_size=256"]),
                       ("tree.budget=100000 on a 512-token model", ["tree.budget=100000"])]:
        code, out, err, folder = audit.run([*RUN, *args])
        log = folder / "specbench.log"
        loaded = log.exists() and "backend/dtype" in log.read_text()
        yield name, audit.verdict(code, err) + ("; the model loaded first" if code and loaded else ""), (
            "accepted: ran with it" if code == 0 else "")


def issue34_main() -> None:
    parser = argparse.ArgumentParser(description="issue 34's cases")
    parser.add_argument("--issue34", action="store_true")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        data = scratch / "data"
        data.mkdir()
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.tree, capture_output=True,
                                text=True).stdout.strip()
        print(f"| case | how it ended at {commit} | what it got silently wrong |\n|---|---|---|")
        for name, how, wrong in issue34_cases(Audit(args.tree.resolve(), scratch), data):
            print(f"| {name} | {how} | {wrong} |", flush=True)


# --- replays, exports, calibration files and skipped prompts (python audit.py --replays [--tree T]) ---

EAGLE3 = """
import sys, torch
from specbench.models.artifact import save_artifact
from specbench.models.tiny import tiny_random
from specbench.training.eagle import EagleModule
target = tiny_random(num_layers=8)
torch.manual_seed(2)
module = EagleModule(target.model, draft_vocab=40, export_dtype="float32", head="eagle3")
module._use_vocabulary(torch.randperm(64, generator=torch.Generator().manual_seed(4))[:40])
save_artifact(sys.argv[1], "eagle", target, module.arch(), module.export_tensors())
"""
MEDUSA = """
import sys, torch
from specbench.drafters.medusa import MedusaHeads
from specbench.models.artifact import save_artifact
from specbench.models.tiny import tiny_random
target = tiny_random()
cfg = target.model.config
torch.manual_seed(1)
heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads=3)
for p in heads.parameters():
    torch.nn.init.normal_(p, std=0.05)
arch = {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_heads": 3, "num_layers": 1,
        "tie_lm_head": True}
save_artifact(sys.argv[1], "medusa", target, arch, heads.state_dict())  # no accuracies, as a published checkpoint
"""


def loaded_first(folder: Path) -> str:
    log = folder / "specbench.log"
    return "; the model loaded first" if log.exists() and "backend/dtype" in log.read_text() else ""


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def read_only_rerun(audit, args: list[str], ro: Path):
    """(exit code, stderr) of `args` run again on its own cache bind-mounted read-only at `ro` (as root), after a
    first run filled it; None where the first run failed or the mount is refused."""
    code, _, err, _ = audit.run(args)
    if code != 0 or subprocess.run(["mount", "--bind", audit.env["SPECBENCH_CACHE"], str(ro)]).returncode != 0:
        return None
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
    env = audit.env
    audit.env = dict(env, SPECBENCH_CACHE=str(ro))
    try:
        code, _, err, _ = audit.run(args)
    finally:
        audit.env = env
        subprocess.run(["umount", str(ro)])
    return code, err


def replay_cases(audit: Audit, data: Path):
    """(case, how it ended, what it lost or got silently wrong, or '')."""
    def python(code: str, *args: str) -> None:
        subprocess.run([sys.executable, "-c", code, *args], cwd=audit.scratch, env=audit.env, check=True)

    # 1. a replay into the folder it reads
    run = audit.finished()
    rows = len((run / "summary.csv").read_text().splitlines())
    code, _, err, _ = audit.run(["task=replay", "model=tiny_random", "method=pld", f"replay.run={run}"], run)
    after = len((run / "summary.csv").read_text().splitlines())
    task = next((line for line in (run / ".hydra" / "config.yaml").read_text().splitlines()
                 if line.startswith("task:")), "")
    yield ("task=replay replay.run=RUN hydra.run.dir=RUN", audit.verdict(code, err),
           f"summary.csv {rows - 1} rows -> {after - 1}; .hydra/config.yaml `{task}`" if after != rows else "")

    # 2-3. exports into the checkpoint they read, and into a folder holding a Medusa checkpoint
    eagle, medusa = audit.scratch / "eagle3.safetensors", audit.scratch / "medusa" / "medusa.safetensors"
    python(EAGLE3, str(eagle))
    python(MEDUSA, str(medusa))
    export = ["task=export", "method=eagle", "model=tiny_random", "model.num_layers=8"]
    out = audit.scratch / "exported"
    audit.run([*export, f"method.checkpoint={eagle}", f"export.out={out}", "export.dtype=float32"])
    before = snapshot(out)
    code, _, err, _ = audit.run([*export, f"method.checkpoint={out}", f"export.out={out}"])
    yield ("task=export method.checkpoint=DIR export.out=DIR (a float32 EAGLE-3 export)", audit.verdict(code, err),
           "the float32 checkpoint was replaced by its bfloat16 copy" if snapshot(out) != before else "")
    (medusa.parent / "config.json").write_text('{"medusa_num_heads": 3}')
    before = snapshot(medusa.parent)
    code, _, err, _ = audit.run([*export, f"method.checkpoint={out}", f"export.out={medusa.parent}"])
    changed = sorted(k for k in before if snapshot(medusa.parent).get(k) != before[k])
    yield ("task=export export.out=<a folder holding a Medusa checkpoint>", audit.verdict(code, err),
           f"overwrote {', '.join(changed)}" if changed else "")

    # 4. suffix decoding replayed on its own run's answers (the defaults: a warm-up generation, the memory probe)
    folder = Path(tempfile.mkdtemp(dir=audit.scratch)) / "run"
    audit.run([*RUN[:2], "eval.num_prompts=5", "eval.max_new_tokens=48", "eval.fastest_plain=false",
               "eval.latency_profile=false", "method=suffix"], folder)
    code, _, err, replayed = audit.run(["task=replay", "model=tiny_random", "method=suffix", f"replay.run={folder}"])
    import pandas as pd

    tau = pd.read_csv(folder / "summary.csv").set_index("method").loc["suffix", "tau"]
    again = pd.read_csv(replayed / "summary.csv")["tau"].item() if (replayed / "summary.csv").exists() else None
    steps = [r["steps"] for r in records(folder) if r["method"] == "suffix"]
    per = pd.read_csv(replayed / "replay.csv")["steps"].tolist() if (replayed / "replay.csv").exists() else []
    yield ("task=replay method=suffix on the run's own answers (tiny, 5 prompts)",
           f"{audit.verdict(code, err)}; replay tau {again:.3f}, run tau {tau:.3f}; steps {per} vs {steps}",
           "the replay differs from the run" if per != steps else "")

    # 5. calibration files that are not one
    (data / "no_key.json").write_text('{"depth": 2}')
    (data / "cut.json").write_text('{"accept_prob": [[0.5, 0.')
    for name, path in [("without its key", data / "no_key.json"), ("cut short", data / "cut.json"),
                       ("a folder", data)]:
        code, _, err, _ = audit.run([*RUN, "method=medusa", f"method.checkpoint={medusa}", "tree=greedy",
                                     f"tree.accept_prob={path}"])
        yield f"tree.accept_prob=<a calibration JSON {name}>", audit.verdict(code, err), ""

    # 6, 9, 10. settings refused only after the model loads, or without the fix
    for name, args in [("eval.engine_options.lookup_tokens=-3", ["eval.engines=[transformers:prompt_lookup]",
                                                                  "eval.engine_options.lookup_tokens=-3"]),
                       ("model.weights=w4a8r_g64", ["model.weights=w4a8r_g64"]),
                       ("model.weights=int4_g64", ["model.weights=int4_g64"]),
                       ("method=suffix method.drafter.max_depth=1", ["method=suffix", "method.drafter.max_depth=1"]),
                       ("method=suffix method.drafter.suffix_tree=cpp", ["method=suffix",
                                                                         "method.drafter.suffix_tree=cpp"])]:
        code, _, err, folder = audit.run([*RUN, *args])
        yield name, audit.verdict(code, err) + (loaded_first(folder) if code else ""), (
            "accepted: ran with it" if code == 0 else "")

    # 7-8. task=calibrate on a 3-head Medusa, and tree=hardware_aware on the file it writes
    calibrate = ["task=calibrate", "model=tiny_random", "method=medusa", f"method.checkpoint={medusa}",
                 "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8", "+calibration.ranks=3"]
    table = audit.scratch / "calibration.json"
    code, _, err, _ = audit.run([*calibrate, f"+calibration.out={table}"])
    yield "task=calibrate method=medusa (3 heads; calibration.depth not given)", audit.verdict(code, err), ""
    code, _, err, _ = audit.run([*calibrate, "+calibration.depth=5"])
    yield "task=calibrate method=medusa +calibration.depth=5 (3 heads)", audit.verdict(code, err), ""
    if not table.exists():
        audit.run([*calibrate, "+calibration.depth=3", f"+calibration.out={table}"])
    code, _, err, _ = audit.run([*RUN, "method=medusa", f"method.checkpoint={medusa}", "tree=hardware_aware",
                                 f"tree.accept_prob={table}", "eval.profile_backends=[eager]",
                                 "eval.profile_weights=[fp]"])
    yield "method=medusa tree=hardware_aware tree.accept_prob=<task=calibrate's file>", audit.verdict(code, err), ""

    # 11. a read-only cache that holds everything the run needs (a profiled run, then the same run)
    ro = audit.scratch / "ro_cache"
    ro.mkdir()
    if (got := read_only_rerun(audit, PROFILE, ro)) is not None:
        yield "SPECBENCH_CACHE read-only, holding the profile the run needs", audit.verdict(*got), ""

    # 11, OpenVINO's cache: an IR exported into the cache, then the same run on it read-only
    import importlib.util

    openvino = [*RUN, "eval.num_prompts=1", "model.backend=openvino", "model.weights=int8"]
    if importlib.util.find_spec("openvino") is not None and (got := read_only_rerun(audit, openvino, ro)) is not None:
        yield ("SPECBENCH_CACHE read-only, holding the OpenVINO IR the run needs (model.backend=openvino)",
               audit.verdict(*got), "")

    # 12. prompts longer than the context
    rows = [{"question_id": "long", "category": "x", "turns": ["word " * 200]},
            {"question_id": "short", "category": "x", "turns": ["hi"]}]
    (data / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out_, err, _ = audit.run([*RUN, "model.max_context=64", "dataset=jsonl", f"dataset.path={data}/long.jsonl",
                                    "eval.max_new_tokens=24"])
    said = [line for line in out_.splitlines() if "skipped" in line]
    yield ("a prompt longer than the context (dataset of 2, model.max_context=64)",
           audit.verdict(code, err) + (f"; printed: `{said[0]}`" if said else ""),
           "the printed table does not say a prompt was skipped" if code == 0 and not said else "")


def busy_case(audit: Audit):
    """13. the same run while other work holds the CPU (the 1-min load above CPUs + 1)."""
    code, out_, err, _ = audit.run([*RUN, "eval.num_prompts=3"])
    said = [line for line in out_.splitlines() if "busy" in line]
    load = os.getloadavg()[0]
    yield (f"a run while {os.cpu_count() * 2} busy loops share the CPU (1-min load {load:.1f} on {os.cpu_count()} "
           f"CPUs)", audit.verdict(code, err) + (f"; printed: `{said[0]}`" if said else ""),
           "no notice that the timings shared the machine" if code == 0 and not said else "")


def replays_main() -> None:
    parser = argparse.ArgumentParser(description="replays, exports, calibration files and skipped prompts")
    parser.add_argument("--replays", action="store_true")
    parser.add_argument("--tree", type=Path, action="append", help="a source tree (repeat for several)")
    args = parser.parse_args()
    trees = [t.resolve() for t in args.tree or [Path(__file__).resolve().parents[2]]]
    for tree in trees:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp)
            (scratch / "data").mkdir()
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                                    text=True).stdout.strip()
            print(f"| case | how it ended at {commit} | what it lost or got wrong |\n|---|---|---|")
            for name, how, wrong in replay_cases(Audit(tree, scratch), scratch / "data"):
                print(f"| {name} | {how} | {wrong} |", flush=True)
    # the busy case last, for every tree while the same load holds the CPU
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * os.cpu_count())]
    try:
        time.sleep(90)  # the 1-min load average climbs towards the spinners' count
        for tree in trees:
            with tempfile.TemporaryDirectory() as tmp:
                for name, how, wrong in busy_case(Audit(tree, Path(tmp))):
                    print(f"| {name} ({tree.name}) | {how} | {wrong} |", flush=True)
    finally:
        for proc in spinners:
            proc.kill()


if __name__ == "__main__":
    if "--issue34" in sys.argv:
        issue34_main()
    elif "--replays" in sys.argv:
        replays_main()
    else:
        main()
