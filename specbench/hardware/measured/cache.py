"""The cache of what this machine measured (profiles, attention windows): where it lies, how a file in it is named and
read, and the lock that keeps two processes from measuring side by side.

A cached measurement is named by the machine's fingerprint (machine.py) and `measuring_key()`: the libraries that run
the measured forwards and MEASURING_VERSION, the version of our code that runs and times them. A file that another
key wrote is another measurement, measured again, never read.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from filelock import FileLock, Timeout

from specbench.errors import SpecbenchError
from specbench.models.loading import cache_dir, cache_root

# Bump when a change to the executions (specbench/execution/), the profiler or the checks stored with a profile would
# make a measurement give other numbers: every machine then measures again. Comments, names and refactors that keep
# what a forward computes and costs leave it alone (the key does not read any source).
MEASURING_VERSION = 4
# the libraries whose kernels and graphs the measured forwards run
MEASURED_LIBRARIES = ("torch", "transformers", "openvino", "nncf")


def measuring_key() -> str:
    """Short hash of MEASURING_VERSION and the installed versions of MEASURED_LIBRARIES (absent ones named so)."""
    versions = [f"v{MEASURING_VERSION}"]
    for name in MEASURED_LIBRARIES:
        try:
            versions.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name}=absent")
    return hashlib.sha256(":".join(versions).encode()).hexdigest()[:10]


def profile_dir() -> Path:
    return cache_root() / "profiles"


_LOCKS: dict[Path, FileLock] = {}


@contextmanager
def measuring_alone(what: str):
    """Hold the cache's measuring lock (flock, through filelock) while this process measures: two first runs on a
    fresh cache would time each other's forwards and cache the contended numbers. A second process waits here for the
    first, then finds what it cached. Checks the cache writable first, so a cache that cannot take the result is one
    line before minutes of measuring. Re-entrant within a process."""
    folder = cache_dir("profiles")
    lock = _LOCKS.setdefault(folder, FileLock(folder / ".measuring.lock", preserve_lock_file=True,
                                              fallback_to_soft=False))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        print(f"waiting for another process measuring this machine (it holds {lock.lock_file}) before measuring "
              f"{what}: measured side by side, both would be wrong", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def read_cached(path: Path, parse):
    """parse(the file's text), or None with a one-line notice naming the file and what is wrong with it."""
    try:
        return parse(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot be read ({exc})"
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc})"
    except SpecbenchError as exc:
        problem = str(exc).removeprefix("the machine profile ")
    print(f"notice: the cached machine profile {path} {problem}; measuring it again")
    return None


def stamp(path: Path) -> tuple[int, int] | None:
    """(mtime, size) of a cache file, None when there is none: whether another process wrote it meanwhile."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
