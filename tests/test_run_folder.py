"""A run folder that cannot be poisoned: every record is checked against settings.json on resume, damaged files are one
line naming what is wrong, labels cannot impersonate plain decoding or leave outputs/, and one run at a time holds the
folder (issue 18)."""

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.utils import setup_globals

from specbench.decoding import Decoder
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import resolve_entries
from specbench.evaluation.run_folder import RecordStore, read_records
from specbench.files import write_atomic
from specbench.tasks import eval as eval_task

from .conftest import CONF, compose_cfg

ROOT = Path(__file__).resolve().parents[1]
RUN = ["model=tiny_random", "method=pld", "eval.dtype=float32", "eval.num_prompts=2", "eval.max_new_tokens=8",
       "eval.warmup=0", "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false",
       "eval.first_turn_only=true"]
TWO = [*RUN, "methods=[pld,{method:pld,label:pld-3,overrides:['tree.budget=3']}]"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished run folder: per prompt, lines plain, pld, pld-3 (6 records)."""
    folder = tmp_path_factory.mktemp("made")
    eval_task.run(compose_cfg(TWO, folder), TWO)
    return folder


@pytest.fixture
def folder(made, tmp_path, monkeypatch):
    """A copy of the finished folder, to damage; a rerun of it must refuse before the model loads."""
    shutil.copytree(made, tmp_path / "run")
    monkeypatch.setattr(eval_task, "setup_target", lambda *a, **k: pytest.fail("the model loaded"))
    return tmp_path / "run"


def lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


def write_lines(folder: Path, rows: list) -> None:
    (folder / "records.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def refused(folder: Path, overrides=TWO) -> str:
    with pytest.raises(SpecbenchError) as exc:
        eval_task.run(compose_cfg(overrides, folder), overrides)
    message = str(exc.value)
    assert "\n" not in message
    return message


def rerun_refused_after_load(folder: Path, monkeypatch, overrides=TWO) -> str:
    """Record checks that need the run's settings hash happen once the dtype is known, i.e. after the model loads."""
    monkeypatch.undo()
    monkeypatch.setattr(Decoder, "generate", lambda *a: pytest.fail("a prompt was decoded"))
    return refused(folder, overrides)


# 1. every record's settings_hash is checked against settings.json


def test_a_record_under_another_methods_hash_is_refused_naming_label_line_and_keys(folder, monkeypatch):
    rows = lines(folder)
    assert [r["method"] for r in rows[:3]] == ["plain", "pld", "pld-3"]
    rows[1]["settings_hash"] = rows[2]["settings_hash"]  # pld-3's result passed off as pld's
    write_lines(folder, rows)
    message = rerun_refused_after_load(folder, monkeypatch)
    assert f"records.jsonl line 2: the record of 'pld' has settings_hash '{rows[2]['settings_hash']}'" in message
    assert "made with other settings (tree.budget: 3 -> 11)" in message


def test_records_made_before_settings_json_was_edited_are_refused_naming_the_keys(folder, monkeypatch):
    settings = json.loads((folder / "settings.json").read_text())
    settings["shared"]["eval"]["max_new_tokens"] = 6  # edited by hand to reuse the records under other settings
    (folder / "settings.json").write_text(json.dumps(settings))
    message = rerun_refused_after_load(folder, monkeypatch, [*TWO, "eval.max_new_tokens=6"])
    assert "records.jsonl line 1 (and 5 more): the record of 'plain'" in message
    assert "eval.max_new_tokens: 8 -> 6" in message


def test_a_record_copied_from_another_folder_is_refused(folder, monkeypatch):
    rows = lines(folder)
    rows[4]["settings_hash"] = "0123456789ab"
    write_lines(folder, rows)
    message = rerun_refused_after_load(folder, monkeypatch)
    assert f"records.jsonl line 5: the record of '{rows[4]['method']}' has settings_hash '0123456789ab'" in message
    assert "a hash no run into this folder wrote" in message


def test_a_rerun_with_fewer_methods_accepts_the_others_records(folder, monkeypatch):
    """pld-3's records stay valid under the settings.json it was saved in, though this run does not list it."""
    monkeypatch.undo()
    monkeypatch.setattr(Decoder, "generate", lambda *a: pytest.fail("a finished prompt was decoded again"))
    summary = eval_task.run(compose_cfg(RUN, folder))
    assert set(summary["method"]) == {"plain", "pld", "pld-3"}


# 2. a label not in settings.json


def test_a_ghost_label_is_refused_with_its_line(folder):
    rows = lines(folder)
    write_lines(folder, [*rows[:2], rows[1] | {"method": "ghost"}, *rows[2:]])
    message = refused(folder)
    assert "records.jsonl line 3: method 'ghost' is not one of this folder's methods in settings.json " \
           "(plain, pld, pld-3)" in message


# 3. and 4. settings.json missing or damaged


def test_records_without_settings_json_are_refused(folder):
    (folder / "settings.json").unlink()
    message = refused(folder, [*TWO, "eval.max_new_tokens=6"])
    assert message == (f"run folder '{folder}' has records.jsonl but no settings.json, so the settings its records "
                       f"were made with are unknown: put its settings.json back, or move records.jsonl away to start "
                       f"over, or give another hydra.run.dir")


@pytest.mark.parametrize(("text", "says"), [("{not json", "is not JSON (Expecting property name"),
                                            ("[]", "is not a settings file"),
                                            ('{"shared": {}, "methods": {"pld": 3}}', "is not a settings file")])
def test_a_corrupt_settings_json_is_one_line(folder, text, says):
    (folder / "settings.json").write_text(text)
    assert refused(folder).startswith(f"{folder / 'settings.json'} {says}")


# 5. records.jsonl: a garbage line, a duplicate, a cut last line


@pytest.mark.parametrize(("line", "says"), [("{garbage", "line 3 is not JSON ('{garbage')"),
                                            ("[1, 2]", "line 3 is not a record ('[1, 2]')")])
def test_a_garbage_line_inside_records_is_refused_with_its_number(folder, line, says):
    rows = lines(folder)
    write_lines(folder, [*rows[:2], line, *rows[2:]])
    assert refused(folder).startswith(f"{folder / 'records.jsonl'} {says}: ")


def test_a_whole_garbage_last_line_is_refused_but_a_cut_one_is_dropped(folder, caplog):
    """A kill can only leave the last line without its newline; a last line that ends in one was written whole."""
    rows = lines(folder)
    write_lines(folder, [*rows, "not a record"])
    assert refused(folder).startswith(f"{folder / 'records.jsonl'} line 7 is not JSON ('not a record')")
    write_lines(folder, rows)
    with (folder / "records.jsonl").open("a") as fh:
        fh.write('{"method": "pld", "question_id": "8')
    store = RecordStore(folder / "records.jsonl")
    assert len(store.rows) == 6 and "line 7 was cut by a kill" in caplog.text
    assert (folder / "records.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in rows)


def test_a_duplicate_record_is_refused_naming_both_lines(folder):
    rows = lines(folder)
    write_lines(folder, [*rows, rows[1]])
    message = refused(folder)
    assert f"{folder / 'records.jsonl'} lines 2 and 7 are the same record (method 'pld', question_id " \
           f"'{rows[1]['question_id']}', turn 0)" in message


# 6. labels


@pytest.mark.parametrize("methods", ["[plain]", "[pld,{method:pld,label:plain}]",
                                     "[{method:pld,label:'plain@eager'}]", "[{method:pld,label:hf_generate}]"])
def test_a_label_naming_plain_decoding_is_refused(methods, tmp_path):
    with pytest.raises(SpecbenchError, match=r"is invalid: plain, plain@\.\.\. and hf_generate name "
                                             r"the plain decodings the run adds itself"):
        resolve_entries(compose_cfg([f"methods={methods}"], tmp_path))


def test_a_label_that_only_begins_with_plain_is_a_method_of_its_own(tmp_path):
    """plain and plain@<execution> name plain decoding; plain-4 (say, PLD at 4 nodes) is just a label."""
    from specbench.names import is_plain

    assert is_plain("plain") and is_plain("plain@eager/bfloat16") and not is_plain("plain-4")
    entries = resolve_entries(compose_cfg(["methods=[{method:pld,label:plain-4}]"], tmp_path))
    assert [e.label for e in entries] == ["plain-4"]


def test_a_single_method_cannot_take_plain_decodings_name(tmp_path):
    with pytest.raises(SpecbenchError, match="method.name=plain is invalid: it names plain decoding"):
        resolve_entries(compose_cfg(["method=pld", "method.name=plain"], tmp_path))
    assert [e.label for e in resolve_entries(compose_cfg(["method=plain"], tmp_path))] == ["plain"]


def test_entries_composed_again_are_equal_and_their_own(tmp_path):
    """Entries are composed once per process and copied out (a run resolves them twice): a second resolution equals the
    first, and changing one entry's config leaves the next resolution untouched."""
    cfg = compose_cfg(["methods=[pld,{method:medusa,overrides:['tree.budget=8']}]"], tmp_path)
    first = resolve_entries(cfg)
    first[1].cfg.tree.budget = 99
    first[0].cfg.method.drafter.max_ngram = 1
    second = resolve_entries(cfg)
    assert [e.label for e in second] == [e.label for e in first]
    assert second[1].cfg.tree.budget == 8 and second[0].cfg.method.drafter.max_ngram != 1


@pytest.mark.parametrize("label", ["/../../x", "a/b", "..", "pld 3", "a\\b"])
def test_a_label_that_is_no_safe_path_component_is_refused(label, tmp_path):
    cfg = compose_cfg([], tmp_path)
    cfg.methods = [{"method": "pld", "label": label}]
    says = f"methods entry label '{label}' is invalid: a label is letters"
    with pytest.raises(SpecbenchError, match=re.escape(says)):
        resolve_entries(cfg)


def test_labels_the_code_generates_stay_valid_unless_they_hold_a_path(tmp_path):
    cfg = compose_cfg(["methods=[pld,{method:medusa,overrides:['tree.budget=8']},{method:draft_model,"
                       "overrides:['tree=dynamic','tree.budget=8']},{method:pld,label:'pld-3,a=b'}]"], tmp_path)
    assert [e.label for e in resolve_entries(cfg)] == ["pld", "medusa[tree.budget=8]",
                                                       "draft_model[tree=dynamic,tree.budget=8]", "pld-3,a=b"]
    cfg.methods = [{"method": "medusa", "overrides": ["method.checkpoint=artifacts/m.safetensors"]}]
    with pytest.raises(SpecbenchError, match=r"its label 'medusa\[method.checkpoint=artifacts/m.safetensors\]' is "
                                             r"invalid.*give the entry a label \(label: NAME\)"):
        resolve_entries(cfg)


# 7. the run folder's name


def test_a_label_cannot_move_the_run_folder_out_of_outputs():
    setup_globals()  # Hydra's own resolvers (now), as in a run
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=['methods=[pld,{method:pld,label:"/../../x"}]'],
                      return_hydra_config=True)
    run_dir = Path(cfg.hydra.run.dir)
    assert run_dir.parent == Path("outputs/eval") and run_dir.name.endswith("_pld+_____x_mt_bench")


# 8. one run at a time


def hold_lock(folder: Path):
    """The lock as any other process holds it: flock on <folder>/.lock with its pid inside."""
    folder.mkdir(parents=True, exist_ok=True)
    fh = (folder / ".lock").open("a+")
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fh.truncate(0)
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


@pytest.mark.slow
def test_a_second_run_into_a_locked_folder_stops_with_one_line(tmp_path):
    folder = tmp_path / "run"
    with hold_lock(folder):
        env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
        proc = subprocess.run([sys.executable, "run.py", *RUN, f"hydra.run.dir={folder}"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "backend/dtype" not in proc.stdout  # refused before the model loads
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: run folder '{folder}' is in use by another run (pid {os.getpid()}, holding {folder / '.lock'}): "
        f"wait for it to finish, or give this run another hydra.run.dir")
    assert not (folder / "records.jsonl").exists() and not (folder / "settings.json").exists()


def test_a_killed_run_releases_the_lock_and_resumes_without_duplicates(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    real, calls = Decoder.generate, {"n": 0}

    def killed_at_the_third_generation(self, prompt_ids):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(self, prompt_ids)

    monkeypatch.setattr(Decoder, "generate", killed_at_the_third_generation)
    with pytest.raises(KeyboardInterrupt):
        eval_task.run(compose_cfg(RUN, folder))
    with (folder / "records.jsonl").open("a") as fh:
        fh.write('{"method": "pld", "question_id": "8')  # the kill cut the line being written
    hold_lock(folder).close()  # free again: the kill released it
    eval_task.run(compose_cfg(RUN, folder))
    keys = [(r["method"], r["question_id"], r["turn"]) for r in lines(folder)]
    assert len(keys) == len(set(keys)) == 4  # 2 prompts x (plain, pld), none twice
    with pytest.raises(SpecbenchError, match="is in use by another run"), hold_lock(folder):
        eval_task.run(compose_cfg(RUN, folder))


# 9. files replaced whole


def test_settings_and_memory_json_are_written_through_a_temporary_file(tmp_path, monkeypatch):
    replaced, real = [], os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append(Path(dst).name), real(src, dst)))
    eval_task.run(compose_cfg([*RUN, "eval.num_prompts=1", "eval.memory_probe=true"], tmp_path))
    assert {"settings.json", "memory.json"} <= set(replaced)
    assert set(json.loads((tmp_path / "memory.json").read_text())) == {"plain", "pld"}


def test_a_write_that_fails_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "settings.json"
    path.write_text('{"old": 1}')
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        write_atomic(path, '{"new": 2}')
    assert path.read_text() == '{"old": 1}' and [p.name for p in tmp_path.iterdir()] == ["settings.json"]


def test_a_rebuilt_datastore_at_the_same_path_is_other_settings(tmp_path):
    """SSSD's settings hold what its datastore file holds now, so a run folder decoded with another datastore at
    the same path is not resumed; a method that does not read it (sources=[input]) does not depend on it."""
    store = tmp_path / "sharegpt.npz"
    store.write_bytes(b"first build")
    over = ["model=tiny_random", "method=sssd", f"datastore.path={store}"]

    def settings(extra=()):
        return resolve_entries(compose_cfg([*over, *extra], tmp_path))[0].settings()

    before = settings()
    assert before == settings() and before["method"]["datastore_fingerprint"] != "missing"
    store.write_bytes(b"second build")
    assert settings()["method"]["datastore_fingerprint"] != before["method"]["datastore_fingerprint"]
    assert "datastore_fingerprint" not in settings(["method.drafter.sources=[input]"])["method"]


def test_records_written_before_plain_decoding_had_one_name_read_under_it(tmp_path):
    """A folder from before the rename (method `autoregressive`, `autoregressive@<execution>`) stays readable: its
    records come back labelled plain, and a method's own labels are left alone."""
    path = tmp_path / "records.jsonl"
    old = [{"method": "autoregressive", "method_name": "autoregressive", "question_id": "1", "turn": 0},
           {"method": "autoregressive@eager/bfloat16", "method_name": "autoregressive", "question_id": "1", "turn": 0},
           {"method": "pld", "method_name": "pld", "question_id": "1", "turn": 0, "reference": "autoregressive"},
           {"method": "autoregressive_like", "method_name": "pld", "question_id": "1", "turn": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    records = read_records(path)
    assert [r["method"] for r in records] == ["plain", "plain@eager/bfloat16", "pld", "autoregressive_like"]
    assert [r["method_name"] for r in records] == ["plain", "plain", "pld", "pld"] and records[2]["reference"] == "plain"
