"""Writing files so that nothing already written is lost: a folder checked writable before the work that fills it,
and files replaced whole. The run folder, the machine profile, the training folder and the quality cache write
through them; the GGUF cache checks its folder with check_writable."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specbench.errors import SpecbenchError


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Create `folder` and write a scratch file in it, so a path under a file, a read-only folder or a full disk ends
    in one line naming the folder before anything is measured or decoded (os.access would pass for root)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as fh:
            fh.write(b"specbench")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise SpecbenchError(f"{what} '{folder}' cannot be written ({exc.strerror or exc}): {fix}") from None


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
