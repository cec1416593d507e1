"""The run folder's files: records.jsonl (one line per prompt, turn and method, flushed at once, so a killed run loses
nothing and a rerun resumes where it stopped), files replaced whole (settings.json, memory.json) and the folder's
lock (one run at a time)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from filelock import FileLock, Timeout

from specbench.errors import SpecbenchError
from specbench.models.loading import check_writable

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"
LOCK_FILE = ".lock"


def record_key(record: dict) -> tuple[str, str, int]:
    return record["method"], str(record["question_id"]), int(record.get("turn", 0))


def write_atomic(path: str | Path, text: str) -> None:
    """Write a temporary file beside path and os.replace it over path: a reader, or a run killed mid-write, sees the
    old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno and not exc.filename:  # a full disk: name the file it missed
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


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
        """Only the last line can be cut by a kill, and then it lacks its newline (a record is written with its
        newline in one call): it is dropped, with a warning, and redone. Any other unreadable line, or a record
        written twice (two runs at once), is refused with its line number."""
        text = self.path.read_text(encoding="utf-8", errors="replace")
        lines, first_line = text.splitlines(), {}
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines) and not text.endswith("\n"):
                    log.warning("%s line %d was cut by a kill (%r): dropped, its prompt is decoded again", self.path,
                                number, line[:40])
                    break
                raise SpecbenchError(f"{self.path} line {number} is not JSON ({line[:40]!r}): only the last line may "
                                     f"be cut by a kill; remove that line or give another hydra.run.dir") from None
            key = _key_or_none(record)
            if key is None:
                raise SpecbenchError(f"{self.path} line {number} is not a record ({line[:40]!r}): each line is a JSON "
                                     f"object with method, question_id and turn; remove that line or give another "
                                     f"hydra.run.dir")
            if key in first_line:
                raise SpecbenchError(f"{self.path} lines {first_line[key]} and {number} are the same record (method "
                                     f"{key[0]!r}, question_id {key[1]!r}, turn {key[2]}): two runs wrote this folder "
                                     f"at once; remove one of the two lines")
            first_line[key] = number
            self.rows.append(record)
            self._done[key] = record
        kept = "".join(line + "\n" for line in lines[: len(self.rows)])
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
