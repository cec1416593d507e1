"""The run folder: what a run writes and what a rerun trusts.

- records.jsonl: one line per prompt, turn and method, flushed at once, so a killed run loses nothing and a rerun
  resumes where it stopped;
- settings.json: the settings that change results, and a hash of them on every record. A rerun into a folder made
  with other settings stops with the differing keys named, so records of different settings are never mixed; new
  methods may be added to a folder whose shared settings match. It also maps every hash it wrote to the settings
  behind it, so a record whose hash is not its method's (a record copied in, or settings.json edited) is refused with
  the differing keys named;
- the provenance columns every record and summary row carries (model, dtype, hw, dataset, the machine, library
  versions, the project's commit);
- the folder's lock (one run at a time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pandas as pd
from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.files import check_writable, write_atomic
from specbench.hardware.measured import machine
from specbench.names import PLAIN, current_record
from specbench.reporting.settings import SETTINGS_FILE, read_settings_file, settings_diff, shown

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"
LOCK_FILE = ".lock"


def record_key(record: dict) -> tuple[str, str, int]:
    return record["method"], str(record["question_id"]), int(record.get("turn", 0))


@contextmanager
def run_folder_lock(run_dir: str | Path):
    """Hold `<run_dir>/.lock` (flock, LOCK_EX | LOCK_NB, through filelock) while a run writes the folder: two runs at
    once would both decode every prompt and append duplicate records. The holder writes its pid into the file, so a
    refused run can name it; the kernel drops the lock when the holder exits, however it ends."""
    run_dir = Path(run_dir)
    check_writable(run_dir, "run folder", "give a hydra.run.dir you can write")
    path = run_dir / LOCK_FILE
    lock = FileLock(path, blocking=False, preserve_lock_file=True, fallback_to_soft=False, on_acquired=_write_pid)
    try:
        lock.acquire()
    except Timeout:
        holder = (path.read_text(encoding="utf-8", errors="replace").split() or ["unknown"])[0][:20]
        raise SpecbenchError(f"run folder '{run_dir}' is in use by another run (pid {holder}, holding {path}): wait "
                             f"for it to finish, or give this run another hydra.run.dir") from None
    except OSError as exc:  # a filesystem without flock: a marker file instead would outlive a killed run
        raise SpecbenchError(f"run folder '{run_dir}' cannot be locked ({exc.strerror or exc}): give a "
                             f"hydra.run.dir on a local filesystem") from None
    try:
        yield
    finally:
        lock.release()


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())


def _key_or_none(record) -> tuple[str, str, int] | None:
    """A line's key, or None when the line is JSON but no record (a list, a number, no method or a bad turn)."""
    try:
        key = record_key(record)
    except (TypeError, KeyError, ValueError):
        return None
    return key if isinstance(key[0], str) else None


def read_records(path: Path) -> list[dict]:
    """A records.jsonl's records in order, read without changing the file (a folder another task reads)."""
    return parse_records(path.read_text(encoding="utf-8", errors="replace"), path)


def parse_records(text: str, path: Path) -> list[dict]:
    """Only the last line can be cut by a kill, and then it lacks its newline (a record is written with its newline
    in one call): it is left out, with a warning. Any other unreadable line, or a record written twice (two runs at
    once), is refused with its line number."""
    lines, first_line, records = text.splitlines(), {}, []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not text.endswith("\n"):
                log.warning("%s line %d was cut by a kill (%r): left out (a resumed run decodes its prompt again)",
                            path, number, line[:40])
                break
            raise SpecbenchError(f"{path} line {number} is not JSON ({line[:40]!r}): only the last line may be cut "
                                 f"by a kill; remove that line or give another hydra.run.dir") from None
        key = _key_or_none(current_record(record) if isinstance(record, dict) else record)
        if key is None:
            raise SpecbenchError(f"{path} line {number} is not a record ({line[:40]!r}): each line is a JSON object "
                                 f"with method, question_id and turn; remove that line or give another hydra.run.dir")
        if key in first_line:
            raise SpecbenchError(f"{path} lines {first_line[key]} and {number} are the same record (method "
                                 f"{key[0]!r}, question_id {key[1]!r}, turn {key[2]}): two runs wrote this folder at "
                                 f"once; remove one of the two lines")
        first_line[key] = number
        records.append(record)
    return records


class RecordStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_symlink():  # appends would land wherever it points, outside the run folder
            raise SpecbenchError(f"{self.path} is a symbolic link (to {os.readlink(self.path)}): a run folder's "
                                 f"records must be its own file; replace the link by a copy of the file "
                                 f"(cp --remove-destination), or give another hydra.run.dir")
        self.rows: list[dict] = []  # rows[i] is line i + 1 of the file
        self._done: dict[tuple[str, str, int], dict] = {}
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        """The file's records (parse_records); a cut last line is dropped from the file too, and its prompt redone."""
        text = self.path.read_text(encoding="utf-8", errors="replace")
        self.rows = parse_records(text, self.path)
        self._done = {record_key(record): record for record in self.rows}
        kept = "".join(line + "\n" for line in text.splitlines()[: len(self.rows)])
        if kept != text:  # a cut last line, or one missing its newline, which the next append would run into
            write_atomic(self.path, kept)

    def get(self, method: str, question_id: str, turn: int = 0) -> dict | None:
        return self._done.get((method, str(question_id), turn))

    def has(self, method: str, question_id: str, turn: int = 0) -> bool:
        return (method, str(question_id), turn) in self._done

    def append(self, record: dict) -> None:
        """One line in one write, unbuffered; a write that fails (a full disk) is cut off again, so the file keeps
        whole lines only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError as exc:
                os.ftruncate(fd, size)
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        finally:
            os.close(fd)
        self.rows.append(record)
        self._done[record_key(record)] = record

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def backbone_reference(label: str) -> str:
    """The label of plain decoding on the backbone that method `label` verifies with (a Medusa-2 artifact's)."""
    return f"{PLAIN}@{label}"


# eval keys that decide how many prompts run or what is measured on the side, not what a prompt's result is
NOT_RESULT_KEYS = {"num_prompts", "warmup", "latency_profile", "profile_sizes", "profile_context", "profile_contexts",
                   "profile_repeats", "memory_probe", "fastest_plain", "profile_backends", "profile_weights",
                   "profile_agreement", "plain_executions", "quality", "engines", "engine_options"}  # an engine's own settings are its row's


def shared_settings(cfg: DictConfig, dtype: str, backend: str, weights: str = "fp", attention: str = "sdpa") -> dict:
    """The run-wide settings that change a prompt's result: model, backend, weights, attention (attention_tag), dtype
    (all auto resolved)
    and decoding settings, data, hw, and the machine (a folder resumed elsewhere would pair one machine's timings, and
    its kernels' near-tie argmaxes, with another's)."""
    eval_cfg = {k: v for k, v in OmegaConf.to_container(cfg.eval, resolve=True).items() if k not in NOT_RESULT_KEYS}
    eval_cfg["dtype"] = dtype
    dataset = {k: v for k, v in OmegaConf.to_container(cfg.dataset, resolve=True).items() if k != "num_prompts"}
    model = OmegaConf.to_container(cfg.model, resolve=True) | {"backend": backend, "weights": weights,
                                                               "attention": attention}
    return {"model": model, "eval": eval_cfg, "dataset": dataset,
            "sampling": OmegaConf.to_container(cfg.sampling, resolve=True), "seed": cfg.seed,
            "hw": OmegaConf.to_container(cfg.hw, resolve=True), "machine": machine.identity()}


def settings_hash(shared: dict, method: dict) -> str:
    return hashlib.sha1(json.dumps({"shared": shared, "method": method}, sort_keys=True, default=str).encode()
                        ).hexdigest()[:12]


@contextmanager
def open_run_folder(run_dir: Path):
    """The folder locked for this run until it ends, however it ends (a second run into it stops with one line), and
    its settings.json and records.jsonl checked before any model or data loads. A run that ends before it wrote a
    record (refused, interrupted) leaves settings.json as it found it: settings saved for nothing would block the
    corrected rerun."""
    with run_folder_lock(run_dir):
        old = read_settings(run_dir)
        RecordStore(run_dir / RECORDS_FILE)  # refuses a symlinked record file; drops a line cut by a kill
        if old is not None:  # without it, read_settings has refused any records
            _check_records(run_dir, old["methods"])
        settings, decoded = run_dir / SETTINGS_FILE, _size(run_dir / RECORDS_FILE)
        found = settings.read_text(encoding="utf-8") if old is not None else None
        try:
            yield
        except BaseException:
            if _size(run_dir / RECORDS_FILE) <= decoded:
                _put_back(settings, found)
            raise


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _put_back(path: Path, text: str | None) -> None:
    if text is None:
        path.unlink(missing_ok=True)
    elif not path.exists() or path.read_text(encoding="utf-8") != text:
        write_atomic(path, text)


def read_settings(run_dir: Path) -> dict | None:
    """The folder's settings.json, its shape checked; None for a new folder. Records without it are refused: the
    settings they were made with would be unknown, and a rerun with other settings would reuse them."""
    path = run_dir / SETTINGS_FILE
    if not path.exists():
        records = run_dir / RECORDS_FILE
        if records.exists() and records.stat().st_size:
            raise SpecbenchError(f"run folder '{run_dir}' has {RECORDS_FILE} but no {SETTINGS_FILE}, so the settings "
                                 f"its records were made with are unknown: put its {SETTINGS_FILE} back, or move "
                                 f"{RECORDS_FILE} away to start over, or give another hydra.run.dir")
        return None
    return read_settings_file(path, _is_settings, "a JSON object {shared: {...}, methods: {label: {...}}, hashes: "
                                                  "{hash: {label, shared, method}}}")


def _is_settings(old) -> bool:
    """hashes may be missing: folders written before it existed are read as they are."""
    def is_map(x) -> bool:
        return isinstance(x, dict) and all(isinstance(v, dict) for v in x.values())

    return (isinstance(old, dict) and isinstance(old.get("shared"), dict) and is_map(old.get("methods"))
            and is_map(old.get("hashes", {}))
            and all(isinstance(h.get("shared"), dict) and isinstance(h.get("method"), dict)
                    for h in old.get("hashes", {}).values()))


def check_and_save_settings(run_dir: Path, shared: dict, methods: dict[str, dict]) -> None:
    """Refuse a folder made with other settings, or holding records that are not its methods' (one line naming the
    keys or the record's line); record new methods otherwise."""
    path = run_dir / SETTINGS_FILE
    old = read_settings(run_dir)
    hashes = {}
    if old is not None:
        diffs = settings_diff(old["shared"], shared)
        for label in methods.keys() & old["methods"].keys():
            diffs += settings_diff(old["methods"][label], methods[label], f"methods[{label}].")
        if diffs:
            raise SpecbenchError(f"run folder '{run_dir}' holds results made with other settings ({shown(diffs)}); "
                                 f"records of different settings are never mixed: rerun without hydra.run.dir (a new "
                                 f"timestamped folder) or give another hydra.run.dir")
        methods, hashes = {**old["methods"], **methods}, old.get("hashes", {})
    own = {label: settings_hash(shared, m) for label, m in methods.items()}
    hashes = hashes | {h: {"label": label, "shared": shared, "method": methods[label]} for label, h in own.items()}
    _check_records(run_dir, methods, shared, hashes)
    write_atomic(path, json.dumps({"shared": shared, "methods": methods, "hashes": hashes}, indent=1,
                                  sort_keys=True, default=str))


def _check_records(run_dir: Path, methods: dict[str, dict], shared: dict | None = None,
                   hashes: dict[str, dict] | None = None) -> None:
    """Every record must be one of the folder's methods (checked when the folder opens) under that method's hash
    (once this run's settings are known): a record from another folder, a hand-made one or one made before
    settings.json was edited would otherwise be summarised as this run's."""
    # plain decoding of a method's own backbone carries that method's settings (Evaluator._with_backbones)
    settings = {backbone_reference(label): m for label, m in methods.items()} | methods
    rows = list(enumerate(RecordStore(run_dir / RECORDS_FILE).rows, 1))
    ghosts = [(number, record) for number, record in rows if record["method"] not in settings]
    if ghosts:
        raise SpecbenchError(f"{_where(run_dir, ghosts)}: method {ghosts[0][1]['method']!r} is not one of this "
                             f"folder's methods in {SETTINGS_FILE} ({', '.join(sorted(methods))}), so no run into "
                             f"this folder wrote it; remove such lines or give another hydra.run.dir")
    if shared is None:
        return
    expected = {label: settings_hash(shared, m) for label, m in settings.items()}
    wrong = [(number, record) for number, record in rows if record.get("settings_hash") != expected[record["method"]]]
    if not wrong:
        return
    label, found = wrong[0][1]["method"], wrong[0][1].get("settings_hash")
    if isinstance(found, str) and found in hashes:
        diffs = (settings_diff(hashes[found]["shared"], shared)
                 + settings_diff(hashes[found]["method"], settings[label]))
        why = f"made with other settings ({shown(diffs) or 'none differ, so the hash was computed otherwise'})"
    else:
        why = "a hash no run into this folder wrote (a record copied from another run folder?)"
    raise SpecbenchError(f"{_where(run_dir, wrong)}: the record of {label!r} has settings_hash {found!r}, not "
                         f"{expected[label]!r} as {label!r} has in {SETTINGS_FILE}: {why}; records of different "
                         f"settings are never mixed: remove such lines or give another hydra.run.dir")


def _where(run_dir: Path, bad: list[tuple[int, dict]]) -> str:
    return f"{run_dir / RECORDS_FILE} line {bad[0][0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The project's commit, '-dirty' when the working tree has uncommitted changes; 'unknown' outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def provenance(cfg: DictConfig, dtype: str, backend: str, weights: str = "fp") -> dict:
    """The columns every record and summary row carries (dtype, backend and weights: the ones the run decodes on,
    auto resolved)."""
    return {"model": cfg.model.name, "dtype": dtype, "backend": backend, "weights": weights, "hw": cfg.hw.name,
            "dataset": cfg.dataset.name,
            **machine.machine_info(), "git_commit": git_commit()}
