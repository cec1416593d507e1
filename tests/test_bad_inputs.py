"""Every bad input is one line naming the full key, the value and what is valid, found before anything loads.

Most cases call specbench.schema.validate in-process (what dispatch runs first); a handful run `python run.py` as a
user does, to show the exit code, the single `error:` line, no traceback and a run folder with nothing in it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.data.prompts import read_jsonl
from specbench.errors import SpecbenchError
from specbench.models.loading import read_config
from specbench.schema import validate
from specbench.tasks._common import check_context

from .conftest import CONF, compose_cfg

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The bad dataset files a user might point dataset.path at."""
    folder = tmp_path_factory.mktemp("data")
    rows = [{"question_id": q, "turns": ["hi"]} for q in ("a", "b", "a", "c", "b")]
    (folder / "dup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "latin1.jsonl").write_bytes('{"question_id": "a", "turns": ["caf\u00e9"]}\n'.encode("latin-1"))
    (folder / "no_key.json").write_text('{"depth": 2, "probs": [[0.5]]}')  # calibration files a user might give
    (folder / "cut.json").write_text('{"accept_prob": [[0.5, 0.')
    return folder


# (overrides, the start of the one-line message); {data}: the folder of `files`
CASES = [
    (["eval.num_prompts=abc"], "eval.num_prompts='abc' is invalid: it must be an integer"),
    (["eval.num_prompts=1.5"], "eval.num_prompts=1.5 is invalid: it must be an integer"),
    (["eval.num_prompts=0"], "eval.num_prompts=0 is invalid: it must be an integer >= 1"),
    (["eval.max_new_tokens=abc"], "eval.max_new_tokens='abc' is invalid: it must be an integer"),
    (["eval.max_new_tokens=100000"], "eval.max_new_tokens=100000 is invalid: it must be an integer <= 511 "
                                     "(model.max_context=512 less one prompt token)"),
    (["model=smollm2_135m", "eval.max_new_tokens=100000"], "eval.max_new_tokens=100000 is invalid: it must be an "
                                                           "integer <= 32768"),
    (["eval.batch_size=abc"], "eval.batch_size='abc' is invalid: it must be an integer"),
    (["eval.warmup=-1"], "eval.warmup=-1 is invalid: it must be an integer >= 0"),
    (["eval.seed=abc"], "eval.seed='abc' is invalid: it must be an integer"),
    (["eval.dtype=abc"], "eval.dtype='abc' is invalid: valid choices: auto, float32, bfloat16, float16"),
    (["eval.plain=maybe"], "eval.plain='maybe' is invalid: it must be true or false"),
    (["eval.first_turn_only=no"], "eval.first_turn_only='no' is invalid: it must be true or false"),
    (["eval.fastest_plain=abc"], "eval.fastest_plain='abc' is invalid: it must be true or false"),
    (["eval.eager_reference=abc"], "eval.eager_reference='abc' is invalid: it must be true or false"),
    (["eval.hf_generate=abc"], "eval.hf_generate='abc' is invalid: it must be true or false"),
    (["eval.memory_probe=abc"], "eval.memory_probe='abc' is invalid: it must be true or false"),
    (["eval.latency_profile=abc"], "eval.latency_profile='abc' is invalid: it must be true or false"),
    (["eval.profile_sizes=abc"], "eval.profile_sizes='abc' is invalid: it must be a list of integers"),
    (["eval.profile_sizes=[1,0]"], "eval.profile_sizes=[1, 0] is invalid: it must be an integer >= 1"),
    (["eval.profile_contexts=[]"], "eval.profile_contexts=[] is invalid: it must be a list of at least one item"),
    (["eval.profile_context=abc"], "eval.profile_context='abc' is invalid: it must be an integer"),
    (["eval.profile_contexts=[128,x]"], "eval.profile_contexts=[128, 'x'] is invalid: it must be a list of integers"),
    (["eval.profile_repeats=0"], "eval.profile_repeats=0 is invalid: it must be an integer >= 1"),
    (["eval.profile_backends=[eager,abc]"], "eval.profile_backends=['eager', 'abc'] is invalid: valid choices"),
    (["+eval.max_new_token=8"], "eval.max_new_token is not a setting; valid keys of eval: num_prompts"),
    (["eval.seed=${nope}"], "eval.seed: Interpolation key 'nope' not found"),
    (["seed=abc"], "seed='abc' is invalid: it must be an integer"),
    (["sampling.temperature=hot"], "sampling.temperature='hot' is invalid: it must be a finite number"),
    (["sampling.temperature=nan"], "sampling.temperature=nan is invalid: it must be a finite number"),
    (["sampling.temperature=inf"], "sampling.temperature=inf is invalid: it must be a finite number"),
    (["sampling.temperature=-1"], "sampling.temperature=-1 is invalid: use 0 (greedy) or a finite value > 0"),
    (["sampling.top_p=abc"], "sampling.top_p='abc' is invalid: it must be a finite number"),
    (["sampling.top_p=1.5"], "sampling.top_p=1.5 is invalid: it must lie in (0, 1]"),
    (["sampling.top_k=abc"], "sampling.top_k='abc' is invalid: it must be an integer"),
    (["sampling.top_k=1.5"], "sampling.top_k=1.5 is invalid: it must be an integer"),
    (["dataset=jsonl"], "dataset.path is not set: dataset=jsonl needs dataset.path=FILE"),
    (["dataset=jsonl", "dataset.path={data}"], "dataset file '{data}' is a directory; set dataset.path"),
    (["dataset=jsonl", "dataset.path={data}/latin1.jsonl"], "dataset file '{data}/latin1.jsonl' is not UTF-8 text "
                                                            "(line 1"),
    (["dataset=jsonl", "dataset.path={data}/dup.jsonl"], "dataset file '{data}/dup.jsonl' repeats question_id 'a' "
                                                         "on lines 1, 3; 'b' on lines 2, 5"),
    (["dataset=jsonl", "dataset.path={data}/none.jsonl"], "dataset file '{data}/none.jsonl' does not exist"),
    (["model=hf"], "model.path is not set: model=hf needs model.path="),
    (["model=hf", "model.path=/nonexistent/model"], "model.path='/nonexistent/model' does not exist"),
    (["model=hf", "model.path={data}"], "model.path='{data}' is a folder without config.json"),
    (["model=hf", "model.path={data}/dup.jsonl"], "model.path='{data}/dup.jsonl' is a file but not a .gguf"),
    (["model.max_context=abc"], "model.max_context='abc' is invalid: it must be an integer"),
    (["model.hidden_size=abc"], "model.hidden_size='abc' is invalid: it must be an integer"),
    (["model.chat_template=abc"], "model.chat_template='abc' is invalid: it must be true or false"),
    (["model.backend=abc"], "model.backend='abc' is unknown"),
    (["model.attention=flash"], "model.attention='flash' is unknown; valid choices: auto, sdpa, eager"),
    (["hw.num_threads=abc"], "hw.num_threads='abc' is invalid: it must be an integer or null"),
    (["tree.budget=abc"], "tree.budget='abc' is invalid: it must be an integer"),
    (["tree=dynamic", "tree.top_k=abc"], "tree.top_k='abc' is invalid: it must be an integer"),
    (["tree=static", "tree.choices=abc"], "tree.choices='abc' is invalid: it must be a list of lists of integers"),
    (["+tree.foo=1"], "tree.foo is not a setting of specbench.trees.native.NativePolicy; valid keys: budget"),
    (["accept=typical", "accept.eps=abc"], "accept.eps='abc' is invalid: it must be a finite number"),
    (["method.drafter.max_ngram=abc"], "method.drafter.max_ngram='abc' is invalid: it must be an integer"),
    (["method=sssd", "method.drafter.samples=abc"], "method.drafter.samples='abc' is invalid: it must be an integer"),
    (["method=medusa", "method.drafter.num_heads=abc"], "method.drafter.num_heads='abc' is invalid"),
    (['methods=[pld,{method:pld,label:x,overrides:["tree.budget=abc"]}]'],
     "methods entry 'x': tree.budget='abc' is invalid: it must be an integer"),
    (["datastore.num_conversations=20000"], "datastore.num_conversations=20000 is invalid: ShareGPT's conversations "
                                            "from 10,000 on are evaluation prompts"),
    (["task=train", "method=eagle", "method.train.data.num_conversations=16384"],
     "method.train.data.num_conversations=16384 is invalid: ShareGPT's conversations from 10,000 on are evaluation "
     "prompts"),
    (["task=train", "method=eagle", "+method.train.data.self_distill.turns=later"],
     "self_distill turns='later' is invalid: pick one of ['first', 'all']"),
    (["task=train", "method=medusa", "method.train.epochs=abc"], "method.train.epochs='abc' is invalid"),
    (["task=train", "method=medusa", "method.train.module.lr=abc"], "method.train.module.lr='abc' is invalid"),
    (["task=train", "method=eagle", "method.train.data.num_workers=-1"],
     "method.train.data.num_workers=-1 is invalid: it must be an integer >= 0"),
    (["task=calibrate", "+calibration.depth=abc"], "calibration.depth='abc' is invalid: it must be an integer"),
    (["tree=greedy", "tree.accept_prob={data}/no_key.json"], "tree.accept_prob='{data}/no_key.json' holds no "
                                                             "\"accept_prob\" key (one list of probabilities per depth)"),
    (["tree=greedy", "tree.accept_prob={data}/cut.json"], "tree.accept_prob='{data}/cut.json' is not JSON ("),
    (["tree=hardware_aware", "tree.accept_prob={data}"], "tree.accept_prob='{data}' is a folder: give the JSON file "
                                                         "`python run.py task=calibrate` writes, or a preset name"),
    (["eval.engine_options.lookup_tokens=-3"], "eval.engine_options.lookup_tokens=-3 is invalid: it must be an "
                                               "integer >= 1"),
    (["eval.engine_options.llama_cpp.n_ctx=0"], "eval.engine_options.llama_cpp.n_ctx=0 is invalid: it must be an "
                                                "integer >= 1"),
    (["+eval.engine_options.lookup_token=3"], "eval.engine_options.lookup_token is not a setting; valid keys of "
                                              "eval.engine_options: threads, lookup_tokens"),
    (["model.weights=w4a8r_g64"], "model.weights='w4a8r_g64' is unknown: the group size is a setting of its own, so "
                                  "give model.weights=w4a8r model.group_size=64"),
    (["model.weights=int4_g64"], "model.weights='int4_g64' is unknown: the group size is a setting of its own, so "
                                 "give model.weights=int4 model.group_size=64"),
    (["model.weights=w4a8_g100"], "model.weights='w4a8_g100' is unknown: the group size is a setting of its own, so "
                                  "give model.weights=w4a8 model.group_size one of 32, 64, 128, 256"),
    (["method=suffix", "method.drafter.max_depth=1"], "method.drafter.max_depth=1 is invalid: it must be an integer "
                                                      ">= 2"),
    (["method=suffix", "method.drafter.min_token_prob=2"], "method.drafter.min_token_prob=2 is invalid: it must be in "
                                                           "[0, 1]"),
    (["method=suffix", "method.drafter.suffix_tree=rust"], "method.drafter.suffix_tree='rust' is invalid"),
    (["method=suffix", "method.drafter.warmup={data}/none.jsonl"], "method.drafter.warmup='{data}/none.jsonl' is not "
                                                                   "a file"),
    (['methods=[{method:suffix,label:s,overrides:["method.drafter.max_spec_factor=-1"]}]'],
     "methods entry 's': method.drafter.max_spec_factor=-1 is invalid: it must be a number >= 0"),
]


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_setting_is_one_line_naming_its_key(overrides, message, files, tmp_path):
    overrides = [o.replace("{data}", str(files)) for o in overrides]
    cfg = compose_cfg(["model=tiny_random", *overrides], tmp_path)
    with pytest.raises(SpecbenchError) as exc:
        validate(cfg)
    assert str(exc.value).startswith(message.replace("{data}", str(files)))
    assert "\n" not in str(exc.value)


NEED_USER_PATHS = ("hf", "jsonl", "vicuna_7b", "vicuna_68m", "gpu/medusa1_vicuna7b", "gpu/spec_bench_vicuna7b")


@pytest.mark.parametrize("group", ["model", "method", "tree", "accept", "hw", "dataset", "sampling", "experiment"])
@pytest.mark.slow
def test_every_shipped_config_passes(group, tmp_path):
    root = Path(CONF) / group
    for choice in sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml")):
        if choice in NEED_USER_PATHS:  # validated with paths given: above, and tests/test_published.py
            continue
        try:
            validate(compose_cfg([f"{group}={choice}"], tmp_path))
        except SpecbenchError as exc:  # a model package this machine lacks is the one acceptable refusal
            assert "is not installed" in str(exc), f"{group}={choice}: {exc}"


def test_repeated_question_ids_name_their_lines(files):
    with pytest.raises(SpecbenchError, match=r"repeats question_id 'a' on lines 1, 3; 'b' on lines 2, 5"):
        read_jsonl(files / "dup.jsonl")


def test_a_models_config_is_read_once_per_file_version(tmp_path, tiny, monkeypatch):
    """Settings checks read the model's config for every config validated (a GGUF's metadata takes seconds to parse):
    read once per process, handed out as copies, and read again when the file changes."""
    import transformers

    reads = []
    real = transformers.AutoConfig.from_pretrained
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: reads.append(a) or real(*a, **k))
    folder = tmp_path / "model"
    tiny.model.config.save_pretrained(folder)
    first = read_config("m", str(folder))
    first.num_hidden_layers = 99
    assert read_config("m", str(folder)).num_hidden_layers == tiny.model.config.num_hidden_layers
    assert len(reads) == 1
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 7}, indent=4))
    os.utime(folder / "config.json", (1, 1))  # another version of the file, whatever the clock's resolution
    assert read_config("m", str(folder)).num_hidden_layers == 7 and len(reads) == 2


def test_the_loaded_models_context_bounds_max_new_tokens(tiny):
    check_context(tiny.max_context - 1, tiny)
    with pytest.raises(SpecbenchError, match=f"eval.max_new_tokens={tiny.max_context} is invalid: it must be an "
                                             f"integer <= {tiny.max_context - 1}"):
        check_context(tiny.max_context, tiny)


def run(args, run_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    return subprocess.run([sys.executable, "run.py", "model=tiny_random", *args, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("args", "key"), [
    (["eval.num_prompts=abc"], "eval.num_prompts"),
    (["sampling.temperature=inf"], "sampling.temperature"),
    (["dataset=jsonl"], "dataset.path"),
    (["model=hf"], "model.path"),
    (["dataset=jsonl", "dataset.path={data}/dup.jsonl"], "question_id"),
])
@pytest.mark.slow
def test_run_py_prints_one_line_and_loads_nothing(args, key, files, tmp_path):
    proc = run([a.replace("{data}", str(files)) for a in args], tmp_path / "run")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and key in errors[0] and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    assert "backend/dtype" not in proc.stdout  # the model was never loaded
    assert not (tmp_path / "run" / "settings.json").exists() and not (tmp_path / "run" / "records.jsonl").exists()
