"""Nothing silently wrong (issue 34): caches, run folders and the command line end in one line naming the path and
what to do, never a traceback, and never leave a half-written file, a stale lock or settings that block the rerun."""

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from specbench.errors import SpecbenchError
from specbench.evaluation import plan as plan_module
from specbench.evaluation.run_folder import RecordStore
from specbench.hardware.measured import machine_profile
from specbench.models import loading
from specbench.models.loading import load_model
from specbench.schema import validate
from specbench.tasks import eval as eval_task

from .conftest import compose_cfg
from .test_machine_profile import PEAKS, fake_latency, load

ROOT = Path(__file__).resolve().parents[1]
RUN = ["model=tiny_random", "method=pld", "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8",
       "eval.warmup=0", "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false",
       "eval.first_turn_only=true"]


def no_model(monkeypatch):
    monkeypatch.setattr(eval_task, "setup_target", lambda *a, **k: pytest.fail("the model loaded"))


def refused(overrides, folder) -> str:
    with pytest.raises(SpecbenchError) as exc:
        eval_task.run(compose_cfg(overrides, folder), overrides)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def user_run(args, env=None, **kwargs):
    """`python run.py ARGS` as a user types it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", **(env or {}))
    return subprocess.Popen([sys.executable, "run.py", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr and "HYDRA_FULL_ERROR" not in stderr, stderr[-3000:]
    return errors[0]


# 1. records written through a symlink


def test_a_symlinked_record_file_is_refused_before_anything_loads(tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text("")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "records.jsonl").symlink_to(outside)
    no_model(monkeypatch)
    message = refused(RUN, folder)
    assert message.startswith(f"{folder / 'records.jsonl'} is a symbolic link (to {outside})")
    assert outside.read_text() == "" and not (folder / "settings.json").exists()


# 2. the machine profile is never measured beside another measuring process


def test_two_first_runs_measure_the_profile_once_never_side_by_side(tiny, tmp_path, monkeypatch, capsys):
    """Two threads stand in for two processes (each flocks through its own descriptor): the second waits for the
    first's measurement and reads it from the cache."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(machine_profile, "measure_peaks", lambda device: PEAKS)
    monkeypatch.setattr(machine_profile, "busy", lambda machine: False)
    spans = []

    def slow_latency(*a, **k):
        start = time.perf_counter()
        time.sleep(0.3)
        spans.append((start, time.perf_counter()))
        return fake_latency(*a, **k)

    monkeypatch.setattr(machine_profile, "latency_profile", slow_latency)
    got = []
    threads = [threading.Thread(target=lambda: got.append(load(tiny))) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert len(got) == 2 and len(spans) == 1  # measured once; the second process read the first's profile
    assert got[0].latency.equals(got[1].latency)
    assert "waiting for another process measuring this machine" in capsys.readouterr().out


# 3. a cache or run folder that cannot be written, a full disk, Ctrl-C


def test_a_cache_that_is_a_file_is_one_line_before_measuring(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    monkeypatch.setattr(machine_profile, "measure_peaks", lambda device: pytest.fail("measured"))
    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: pytest.fail("measured"))
    with pytest.raises(SpecbenchError, match=f"cache folder '{cache / 'profiles'}' cannot be written .*: set "
                                             f"SPECBENCH_CACHE to a folder you can write"):
        load(tiny)


def read_only(monkeypatch):
    """A read-only filesystem (as root, chmod would not stop a write): creating a file there fails with EROFS."""
    def refuse(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


def test_a_read_only_cache_is_one_line_before_measuring(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(machine_profile, "latency_profile", lambda *a, **k: pytest.fail("measured"))
    read_only(monkeypatch)
    with pytest.raises(SpecbenchError, match="cache folder .* cannot be written \\(Read-only file system\\)"):
        load(tiny)


def test_a_read_only_run_folder_is_one_line_before_the_model_loads(tmp_path, monkeypatch):
    no_model(monkeypatch)
    read_only(monkeypatch)
    message = refused(RUN, tmp_path / "run")
    assert message == (f"run folder '{tmp_path / 'run'}' cannot be written (Read-only file system): give a "
                       f"hydra.run.dir you can write")


def test_a_record_that_fills_the_disk_leaves_whole_lines_only(tmp_path, monkeypatch):
    store = RecordStore(tmp_path / "records.jsonl")
    store.append({"method": "a", "question_id": "1", "turn": 0})
    before = store.path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as exc:
        store.append({"method": "a", "question_id": "2", "turn": 0})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(store.path)
    assert store.path.read_bytes() == before and not store.has("a", "2")


def cli_with_append(imports: str, append: str) -> str:
    """`python -c` source running the CLI as run.py does, with RecordStore.append replaced by `append` (its body, which
    may call `real(self, record)` and count `calls`)."""
    return f"""import sys, {imports}
from specbench.evaluation import run_folder
real, calls = run_folder.RecordStore.append, []
def append(self, record):
{append}
run_folder.RecordStore.append = append
sys.argv = ["run.py", *sys.argv[1:]]
from specbench.cli import main
main()
"""


CLI = cli_with_append("errno, os", """    calls.append(1)
    if len(calls) == 3:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
    real(self, record)""")


@pytest.mark.slow
def test_a_full_disk_is_one_line_keeping_the_records_and_the_rerun_resumes(tmp_path):
    folder = tmp_path / "run"
    args = [*RUN, f"hydra.run.dir={folder}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    proc = subprocess.run([sys.executable, "-c", CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    line = error_line(proc.stderr)
    assert line.startswith(f"error: cannot write {folder / 'records.jsonl'} (No space left on device): free space "
                           f"on its disk; 2 records kept in {folder / 'records.jsonl'}; resume with: python run.py ")
    rerun = user_run(args)
    rerun.communicate(timeout=300)
    assert rerun.returncode == 0  # the lock was released, and the rerun decodes only what is missing
    keys = [(r["method"], r["question_id"]) for r in map(json.loads, (folder / "records.jsonl").open())]
    assert len(keys) == len(set(keys)) == 4


# a long run as the user meets it: after its second record the run takes its time (a real one would decode on), so
# Ctrl-C lands mid-run however busy the machine is. SIGINT as a terminal has it: pytest-xdist's workers ignore SIGINT,
# and a child inherits an ignored signal (Python then installs no KeyboardInterrupt handler), so under `-n auto` the
# run ignored Ctrl-C and finished with 0
SLOW_CLI = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + cli_with_append("time", """\
    real(self, record)
    calls.append(1)
    if len(calls) == 2:
        time.sleep(300)""")


@pytest.mark.slow
def test_ctrl_c_is_one_line_saying_what_was_kept_and_the_exact_rerun(tmp_path):
    folder = tmp_path / "run"
    args = [*RUN, "eval.num_prompts=20", "eval.max_new_tokens=64"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, *args, f"hydra.run.dir={folder}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    records = folder / "records.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not records.exists() or records.read_bytes().count(b"\n") < 2):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    kept = records.read_bytes().count(b"\n")
    line = error_line(err)
    assert line.startswith(f"error: interrupted; {kept} records kept in {records}; resume with: python run.py ")
    assert line.endswith(f"hydra.run.dir={folder}")
    rerun = user_run([*args, f"hydra.run.dir={folder}"])
    rerun.communicate(timeout=600)
    assert rerun.returncode == 0  # the lock was released
    keys = [(r["method"], r["question_id"]) for r in map(json.loads, records.open())]
    assert len(keys) == len(set(keys)) == 40


@pytest.mark.slow
def test_report_with_a_bad_folder_and_no_experiment_is_one_line(tmp_path):
    proc = user_run(["task=report", f"report.run={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'r'}"])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and error_line(err).startswith("error: task=report needs an experiment with a report")


def test_wandb_online_without_an_api_key_is_one_line_before_anything_loads(tmp_path, monkeypatch):
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    cfg = compose_cfg([*RUN, "logger=wandb", "logger.offline=false", "logger.save_dir=.", "logger.group=g"])
    with pytest.raises(SpecbenchError, match="logger.offline=false sends the run to W&B, but no API key for "
                                             "api.wandb.ai is set"):
        validate(cfg)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    validate(cfg)


def test_a_cut_converted_model_is_converted_again_with_one_notice(tiny, tmp_path, monkeypatch, capsys):
    """The GGUF's safetensors copy in the cache, cut by a full disk or a kill: converted again, not a traceback."""
    import transformers

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    cached = loading.cache_root() / "models" / f"m-{loading._fingerprint(gguf)}"
    tiny.model.save_pretrained(cached)
    tiny.tokenizer.save_pretrained(cached)
    weights = cached / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    conversions = []
    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tok = transformers.AutoTokenizer.from_pretrained

    def model_from(path, *a, gguf_file=None, **k):
        if gguf_file:  # the conversion: the GGUF read and dequantised
            conversions.append(gguf_file)
            return real_model(tmp_path / "reference", *a, **k)
        return real_model(path, *a, **k)

    def tokenizer_from(path, *a, gguf_file=None, **k):
        return real_tok(tmp_path / "reference" if gguf_file else path, *a, **k)

    tiny.model.save_pretrained(tmp_path / "reference")
    tiny.tokenizer.save_pretrained(tmp_path / "reference")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer_from)
    loaded = load_model("m", str(gguf), dtype="float32")
    assert conversions == ["m.gguf"]
    assert f"notice: the converted model {cached} cannot be read" in capsys.readouterr().out
    assert torch.equal(loaded.model.lm_head.weight, tiny.model.lm_head.weight)
    again = load_model("m", str(gguf), dtype="float32")  # the mended copy is read, nothing converted
    assert conversions == ["m.gguf"] and torch.equal(again.model.lm_head.weight, tiny.model.lm_head.weight)


# 4. misleading messages


def test_a_run_refused_before_decoding_leaves_the_folder_as_it_found_it(tmp_path, monkeypatch):
    """settings.json saved by a run that then stopped would refuse the corrected rerun as 'other settings'."""
    folder = tmp_path / "run"

    def refuse(*a, **k):
        raise SpecbenchError("refused while building the drafter")
    real = plan_module.build_drafter
    monkeypatch.setattr(plan_module, "build_drafter", refuse)
    refused([*RUN, "eval.max_new_tokens=6"], folder)
    assert not (folder / "settings.json").exists()
    monkeypatch.setattr(plan_module, "build_drafter", real)
    eval_task.run(compose_cfg(RUN, folder), RUN)  # the corrected rerun, with other settings
    settings = (folder / "settings.json").read_text()
    monkeypatch.setattr(plan_module, "build_drafter", refuse)  # a folder with results: a refused rerun adding a method
    more = [*RUN, "methods=[pld,{method:pld,label:pld-3,overrides:['tree.budget=3']}]"]
    refused(more, folder)
    assert (folder / "settings.json").read_text() == settings


@pytest.fixture
def datasets(tmp_path):
    rows = [{"question_id": "a", "turns": ["hi"]}, {"question_id": "b", "turns": ["ho"]}]
    (tmp_path / "array.jsonl").write_text(json.dumps(rows))
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    (tmp_path / "empty.jsonl").write_text("\n")
    return tmp_path


def test_a_json_array_file_is_one_line_saying_so(datasets):
    with pytest.raises(SpecbenchError) as exc:
        validate(compose_cfg([*RUN, "dataset=jsonl", f"dataset.path={datasets / 'array.jsonl'}"], datasets))
    assert "line 1 is malformed (it is an array, not a JSON object" in str(exc.value)
    assert "list indices" not in str(exc.value)


def test_a_byte_order_mark_is_read(datasets):
    from specbench.data.prompts import read_jsonl

    assert [p.question_id for p in read_jsonl(datasets / "bom.jsonl")] == ["a", "b"]


def test_an_empty_dataset_is_one_line_before_the_model_loads(datasets):
    with pytest.raises(SpecbenchError, match=f"dataset file '{datasets / 'empty.jsonl'}' is empty"):
        validate(compose_cfg([*RUN, "dataset=jsonl", f"dataset.path={datasets / 'empty.jsonl'}"], datasets))


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.weights=int4", "model.group_size=256"],
     "model.group_size=256 is invalid for model tiny_random: it must divide every linear's input channels "
     "(64, 128); give one of 32, 64"),
    (["model.weights=auto", "eval.profile_weights=[fp,int4]", "model.group_size=128"],
     "model.group_size=128 is invalid for model tiny_random"),
    (["tree.budget=100000"], "tree.budget=100000 is invalid: a tree of 100000 nodes cannot fit model tiny_random's "
                             "context of 512 tokens; it must be an integer <= 512"),
    (["methods=[pld,{method:pld,label:big,overrides:['tree.budget=600']}]"],
     "methods entry 'big': tree.budget=600 is invalid"),
])
def test_settings_that_do_not_fit_the_model_are_refused_from_its_config(overrides, message, tmp_path):
    """Checked when the model's config is read (dispatch's validate), before its weights load."""
    with pytest.raises(SpecbenchError) as exc:
        validate(compose_cfg([*RUN, *overrides], tmp_path))
    assert str(exc.value).startswith(message)


def test_settings_that_fit_the_model_pass(tmp_path):
    validate(compose_cfg([*RUN, "model.weights=int4", "model.group_size=64", "tree.budget=512"], tmp_path))


def test_a_conversion_removes_what_killed_ones_left_and_keeps_a_running_ones(tmp_path, tiny):
    """Each conversion writes its own <name>.tmp<pid>: a killed one's folder goes at the next conversion, one whose
    process still runs (another first run converting now) stays."""
    out = tmp_path / "model"
    dead = tmp_path / "model.tmp999999999"  # beyond any pid Linux hands out
    running = tmp_path / f"model.tmp{os.getppid()}"
    dead.mkdir(), running.mkdir()
    loading._save_cache(tiny.model, tiny.tokenizer, out)
    assert (out / "config.json").exists() and not dead.exists() and running.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", running.name]
