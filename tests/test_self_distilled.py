"""datastore=self_distilled: SSSD's index of the target's own greedy answers, generated resumably, capped to a size,
found by method=sssd; bad input in one line."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.acceptance import ExactAcceptance
from specbench.data.datastore import Datastore, capped
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter
from specbench.sampling import SamplingParams
from specbench.tasks import dispatch
from specbench.training.self_distill import read_cache
from specbench.training.sharegpt import prompt_ids
from specbench.trees.native import NativePolicy

from .conftest import compose_cfg

ROOT = Path(__file__).parents[1]
CHATS = [[{"role": "user", "content": text}] for text in
         ["the cat sat on the mat", "a dog ran after the cat", "abc abc abc", "hello hello world", "x y z x y"]]
SMALL = ["model=tiny_random", "datastore=self_distilled", "datastore.max_new_tokens=12", "datastore.batch_size=1"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache and a ShareGPT of five one-turn chats; every read is recorded."""
    import specbench.data.sharegpt as sharegpt

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    reads = []
    monkeypatch.setattr(sharegpt, "read_sharegpt", lambda n: reads.append(n) or CHATS[:n])
    monkeypatch.setattr("specbench.data.prompts.read_sharegpt", sharegpt.read_sharegpt)
    return tmp_path / "cache"


def documents(store: Datastore) -> list[list[int]]:
    """The store's documents, split at its separator."""
    docs, doc = [], []
    for token in store.tokens.tolist():
        if token == store.separator:
            docs.append(doc)
            doc = []
        else:
            doc.append(token)
    return docs


def test_capped_keeps_documents_in_order_up_to_the_token_count_cutting_the_last():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    assert capped(docs, None) == docs
    assert capped(docs, 4) == [[1, 2, 3], [4]]
    assert capped(docs, 5) == [[1, 2, 3], [4, 5]]
    assert capped(docs, 100) == docs


def test_the_index_holds_the_targets_greedy_answers_to_the_prompts(tiny, cache, tmp_path):
    path = dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.num_conversations=3"], tmp_path / "run"))
    assert path == cache / "datastores" / "tiny_random" / "self_distilled.npz"
    store = Datastore.load(path, tiny.tokenizer, tiny.name)
    assert store.meta["corpus"] == "self_distilled" and store.meta["num_conversations"] == 3
    for chat, doc in zip(CHATS[:3], documents(store), strict=True):
        prompt = prompt_ids(tiny.tokenizer, chat, 128)
        answer = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 12,
                         tiny.eos_token_ids).generate(prompt).tokens
        assert doc == prompt + answer


def test_a_larger_corpus_answers_only_the_missing_prompts_and_keeps_the_cache(tiny, cache, tmp_path, monkeypatch):
    import specbench.training.self_distill as self_distill

    dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.num_conversations=2"], tmp_path / "run"))
    answers = next((cache / "training").glob("selfdistill-tiny_random-*.jsonl"))
    before = answers.read_bytes()
    generated = []
    real = self_distill._greedy
    monkeypatch.setattr(self_distill, "_greedy", lambda model, prompts, *a: generated.extend(prompts)
                        or real(model, prompts, *a))
    path = dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.num_conversations=4"], tmp_path / "run"))
    assert len(generated) == 2  # prompts 3 and 4 alone
    assert answers.read_bytes().startswith(before) and len(answers.read_text().splitlines()) == 4
    assert len(documents(Datastore.load(path, tiny.tokenizer, tiny.name))) == 4
    dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.num_conversations=3"], tmp_path / "run"))
    assert len(generated) == 2  # fewer asked: all cached, the index of the first three
    assert len(documents(Datastore.load(path, tiny.tokenizer, tiny.name))) == 3


def test_with_sharegpt_indexes_sharegpts_conversations_after_the_answers(tiny, cache, tmp_path):
    from specbench.data.datastore import sharegpt_documents

    path = dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.num_conversations=2",
                                 "datastore.with_sharegpt=3"], tmp_path / "run"))
    store = Datastore.load(path, tiny.tokenizer, tiny.name)
    docs = documents(store)
    assert len(docs) == 5 and store.meta["with_sharegpt"] == 3
    answers = read_cache(next((cache / "training").glob("selfdistill-tiny_random-*.jsonl")))
    assert docs[:2] == [r["prompt"] + r["response"] for r in answers]  # the answers first, then ShareGPT's text
    assert docs[2:] == sharegpt_documents(tiny.tokenizer, 3, True)


@pytest.mark.parametrize("corpus", ["self_distilled", "sharegpt"])
def test_max_tokens_caps_either_corpus_to_the_same_size(tiny, cache, tmp_path, corpus):
    path = dispatch(compose_cfg(["model=tiny_random", f"datastore={corpus}", "task=datastore",
                                 "datastore.num_conversations=5", "datastore.max_tokens=100",
                                 f"datastore.path={tmp_path / corpus}.npz"]
                                + (SMALL[2:] if corpus == "self_distilled" else []), tmp_path / "run"))
    store = Datastore.load(path, tiny.tokenizer, tiny.name)
    assert sum(map(len, documents(store))) == 100 and store.meta["max_tokens"] == 100


def test_method_sssd_drafts_from_it_when_the_run_names_it(tiny, cache, tmp_path):
    dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.num_conversations=2"], tmp_path / "run"))
    cfg = compose_cfg(["method=sssd", "model=tiny_random", "datastore=self_distilled"], tmp_path / "run")
    drafter = build_drafter(cfg.method.drafter, tiny, NativePolicy(8))
    assert drafter.store.meta["corpus"] == "self_distilled"
    missing = compose_cfg(["method=sssd", "model=tiny_random", "datastore=self_distilled",
                           f"datastore.path={tmp_path}/none.npz"], tmp_path / "run")
    with pytest.raises(SpecbenchError, match=r"none.npz' does not exist; build it with `python run.py task=datastore "
                                             r"model=tiny_random`"):
        build_drafter(missing.method.drafter, tiny, NativePolicy(8))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("openvino_genai") is None or importlib.util.find_spec("nncf") is None,
                    reason="openvino-genai or nncf is not installed")
def test_the_engine_answers_as_the_eager_loop_in_fp32_into_a_cache_of_its_own(tiny, tmp_path):
    """generator=openvino: GenAI's continuous batching on the target's fp32 IR writes the eager loop's greedy answers
    (the tiny model's fp32 rounding is the same on both), in its own answer cache, named in the index's metadata.
    Both run as `python run.py` in a subprocess, so no test worker keeps GenAI's pipeline and its threads."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECBENCH_CACHE=str(tmp_path / "cache"))

    def build(name: str, *extra: str) -> Datastore:
        args = [sys.executable, "run.py", *SMALL, "task=datastore", "datastore.num_conversations=4", *extra,
                f"datastore.path={tmp_path}/{name}.npz", f"hydra.run.dir={tmp_path}/{name}"]
        proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return Datastore.load(tmp_path / f"{name}.npz", tiny.tokenizer, tiny.name)

    by_eager = build("eager")
    by_engine = build("engine", "datastore.batch_size=3", "datastore.generator=openvino",
                      "datastore.generator_weights=fp32")
    assert documents(by_engine) == documents(by_eager) and len(documents(by_engine)) == 4
    assert by_engine.meta["generator"] == "openvino" and by_engine.meta["generator_weights"] == "fp32"
    assert "generator" not in by_eager.meta
    caches = sorted((tmp_path / "cache" / "training").glob("selfdistill-tiny_random-*.jsonl"))
    assert len(caches) == 2 and sorted(len(read_cache(c)) for c in caches) == [4, 4]


@pytest.mark.parametrize("override, message", [
    ("datastore.corpus=web", r"datastore.corpus='web' is invalid"),
    ("datastore.num_conversations=10001", "datastore.num_conversations=10001 is invalid"),
    ("datastore.max_tokens=0", "datastore.max_tokens=0 is invalid"),
    ("datastore.dtype=int8", "datastore.dtype='int8' is invalid"),
    ("model.chat_template=false", "datastore=self_distilled prompts the target through its chat template"),
    ("datastore.generator=vllm", r"datastore.generator='vllm' is invalid"),
])
def test_bad_settings_are_one_line_before_any_answer(cache, tmp_path, override, message):
    with pytest.raises(SpecbenchError, match=message):
        dispatch(compose_cfg([*SMALL, "task=datastore", override], tmp_path / "run"))
    assert not (cache / "training").exists()


@pytest.mark.skipif(importlib.util.find_spec("openvino_genai") is None, reason="openvino-genai is not installed")
def test_the_engines_weights_are_checked_before_the_model_loads(cache, tmp_path, monkeypatch):
    monkeypatch.setattr("specbench.tasks.datastore.build_model", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(SpecbenchError, match=r"^datastore.generator_weights='int3' is invalid: give fp32, fp16, int8 "
                                             r"or int4_g<group>"):
        dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.generator=openvino",
                              "datastore.generator_weights=int3"], tmp_path / "run"))


@pytest.mark.skipif(importlib.util.find_spec("openvino_genai") is None, reason="openvino-genai is not installed")
def test_an_int4_group_that_does_not_divide_the_models_widths_is_one_line_before_any_answer(cache, tmp_path):
    with pytest.raises(SpecbenchError, match=r"^datastore.generator_weights=int4_g100 is invalid for this model: "):
        dispatch(compose_cfg([*SMALL, "task=datastore", "datastore.generator=openvino",
                              "datastore.generator_weights=int4_g100"], tmp_path / "run"))
    assert not (cache / "training").exists()
