"""The `specbench` command (and `python run.py`): Hydra composes the run from the config groups shipped in
specbench/conf, then specbench.tasks.dispatch runs it. Bad input ends as one `error:` line and exit code 2."""

import errno
import logging
import os
import shlex
import sys
from pathlib import Path

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

import specbench.config  # noqa: F401  (registers the resolvers the configs use)
from specbench.names import OLD_SETTINGS

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub at run time


def main() -> None:
    """The command: an unknown experiment is one line here, then Hydra composes the run and dispatches it."""
    error = unknown_experiment(sys.argv[1:]) or renamed_setting(sys.argv[1:])
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    _run()


def experiment_options() -> list[str]:
    """Every saved experiment as `experiment=` takes it: GROUP/NAME, one subfolder per question it answers."""
    root = specbench.config.CONF_DIR / "experiment"
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def unknown_experiment(args: list[str]) -> str | None:
    """Hydra names only the top level of a nested group when a choice is unknown, which for experiment/ lists none
    of its GROUP/NAME files: an unknown one (an old run's flat name too) is refused with them all and the closest."""
    import difflib

    options = experiment_options()
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") != "experiment" or value in ("", "null") or "(" in value:  # a sweep function: Hydra's
            continue
        for name in value.split(","):
            if name not in options:
                close = [o for o in options if o.rpartition("/")[2] == name] or \
                    difflib.get_close_matches(name, options, n=1, cutoff=0.5)
                hint = f" (closest: {' or '.join(close)})" if close else ""
                return f"experiment={name} is not a saved experiment{hint}; valid: {', '.join(options)}"
    return None


def renamed_setting(args: list[str]) -> str | None:
    """A setting or method that took plain decoding's one name (specbench/names.py): Hydra would answer its old name
    with a struct error of several lines; this names the new one."""
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        for old in (f"{key}={value}", key):
            if old in OLD_SETTINGS:
                new = OLD_SETTINGS[old] + ("" if "=" in old else f"={value}")
                return f"{arg} is invalid: plain decoding's settings and method are named plain now; give {new}"
    return None


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _run(cfg: DictConfig):
    from omegaconf.errors import OmegaConfBaseException

    from specbench.errors import SpecbenchError
    from specbench.schema import config_error
    from specbench.tasks import dispatch

    logging.raiseExceptions = False  # a log line lost to a full disk is no traceback; records' writes say so below
    try:
        return dispatch(cfg)
    except (SpecbenchError, OmegaConfBaseException) as exc:  # an OmegaConf error is a config the user can fix too
        exc = config_error(exc) if isinstance(exc, OmegaConfBaseException) else exc
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        if exc.errno not in FIXABLE:
            raise
        fix = "free space on its disk" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
        where = f"{exc.filename} " if exc.filename else ""
        print(f"\nerror: cannot write {where}({exc.strerror}): {fix}; {_kept_and_rerun(cfg.task)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the folder's lock is released by now; a run that decoded nothing left it as found
        print(f"\nerror: interrupted; {_kept_and_rerun(cfg.task)}", file=sys.stderr)
        sys.exit(130)


class WritableRunFolder(Callback):
    """Hydra writes .hydra/ and the log into the run (or sweep) folder before any task runs, so a folder that cannot
    be written would end in Hydra's error dump: checked first, it is one line (conf/config.yaml: hydra.callbacks).
    A run folder is also checked to be no other run's (tasks/_common.check_run_folder), and one that already holds
    .hydra/ keeps it: the command that made the folder, which a resume (or a rerun its settings refuse) would
    otherwise overwrite."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from omegaconf import read_write

        from specbench.errors import SpecbenchError
        from specbench.tasks._common import check_run_folder

        folder = Path(config.hydra.run.dir)
        try:
            check_run_folder(config, folder, list(config.hydra.overrides.task))
        except SpecbenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        _writable(config.hydra.run.dir, "hydra.run.dir")
        if (folder / str(config.hydra.output_subdir) / "config.yaml").exists():
            with read_write(config.hydra):
                config.hydra.output_subdir = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _writable(config.hydra.sweep.dir, "hydra.sweep.dir")


def _writable(folder: str, key: str) -> None:
    from specbench.errors import SpecbenchError
    from specbench.files import check_writable

    try:
        check_writable(Path(folder), "run folder", f"give a {key} you can write")
    except SpecbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


# a write the user can make succeed: a full disk or quota, a read-only or forbidden path
FIXABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _kept_and_rerun(task: str) -> str:
    """What the run folder keeps, and the command that resumes it (into the same folder: the default one is new each
    run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from specbench.evaluation.run_folder import RECORDS_FILE

    hydra = HydraConfig.get()
    out = Path(hydra.runtime.output_dir)
    args = list(sys.argv[1:])
    if hydra.mode != RunMode.MULTIRUN and not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={out}")
    prog = ["specbench"] if Path(sys.argv[0]).name == "specbench" else ["python", sys.argv[0]]
    command = shlex.join([*prog, *args])
    if task != "eval":
        return f"what the run wrote is in {out}; rerun: {command}"
    records = out / RECORDS_FILE
    kept = records.read_bytes().count(b"\n") if records.exists() else 0  # whole lines: a cut one is redone
    return (f"{kept} records kept in {records}; resume with: {command}" if kept
            else f"nothing was decoded, the run folder is as it was; rerun: {command}")
