"""task=train end to end on the tiny model: Lightning fit, trainable-only checkpoints, resume, artifact checks."""

import json

import lightning as L
import pandas as pd
import pytest

from specbench.data.sharegpt import read_sharegpt
from specbench.errors import SpecbenchError
from specbench.tasks.train import train
from specbench.models.artifact import load_artifact, save_artifact
from specbench.training.sharegpt import format_conversation

from .conftest import compose_cfg

SMALL = ["model=tiny_random", "method.train.data.num_conversations=10", "method.train.data.num_val=3",
         "method.train.data.max_length=96", "method.train.data.batch_size=2", "method.train.data.self_distill=null",
         "method.train.epochs=1", "method.train.checkpoint_every_n_steps=1", "trainer.log_every_n_steps=1"]


def test_sharegpt_salvages_the_truncated_file_and_marks_assistant_tokens(tiny):
    conversations = read_sharegpt(3)
    assert len(conversations) == 3 and conversations[0][0]["role"] == "user"
    example = format_conversation(tiny.tokenizer, conversations[0], 400)
    text = tiny.tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])
    assert text.strip() and conversations[0][1]["content"].startswith(text[:20])


@pytest.mark.parametrize("method", ["medusa", "ppd"])
@pytest.mark.slow
def test_train_exports_an_artifact_the_drafter_loads(method, tmp_path, tiny):
    cfg = compose_cfg([f"method={method}", "method.train.max_steps=2", *SMALL], tmp_path)
    summary = train(cfg, tmp_path)
    meta, tensors = load_artifact(summary["artifact"], method, tiny)
    assert meta["train"]["module"]["_target_"].endswith("Module") and tensors
    assert meta["metrics"]["trainable_params"] == sum(t.numel() for t in tensors.values())  # what trains is stored
    assert 0 < meta["metrics"]["trainable_share"] and len(meta["metrics"]["rank_accuracy"]) >= 3
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and (tmp_path / "logs" / "metrics.csv").exists()


class Interrupt(L.Callback):
    """Kills the fit once `at` optimizer steps are done (and checkpointed), as a crash or Ctrl-C would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step >= self.at:
            raise RuntimeError("simulated interruption")


class FirstStep(L.Callback):
    def on_train_batch_start(self, trainer, *args) -> None:
        self.seen = getattr(self, "seen", trainer.global_step)


@pytest.mark.slow
def test_interrupted_training_resumes_from_the_saved_step(tmp_path):
    cfg = compose_cfg(["method=medusa", *SMALL, "method.train.epochs=3"], tmp_path)
    with pytest.raises(RuntimeError, match="simulated interruption"):
        train(cfg, tmp_path, callbacks=[Interrupt(at=3)])
    first = FirstStep()
    summary = train(cfg, tmp_path, callbacks=[first])
    assert first.seen == 3  # continued from the checkpoint at step 3, not from 0
    assert summary["global_step"] > 3
    # the training curve spans both fits, though Lightning's CSVLogger restarted metrics.csv at the resume
    history = pd.read_csv(tmp_path / "plots" / "training_curves.csv")
    assert history["step"].min() < 3 and history["step"].max() >= summary["global_step"] - 1
    assert pd.read_csv(tmp_path / "logs" / "metrics.csv")["step"].min() >= 3
    assert (tmp_path / "plots" / "training_curves.png").stat().st_size > 10_000


def test_artifacts_are_checked_before_use(tmp_path, tiny):
    from specbench.models import tiny_random

    path = save_artifact(tmp_path / "a.safetensors", "medusa", tiny, {}, {"w": tiny.model.lm_head.weight[:2]})
    with pytest.raises(SpecbenchError, match="hidden size"):
        load_artifact(path, "medusa", tiny_random(hidden_size=32))
    with pytest.raises(SpecbenchError, match="'medusa' drafter, not a 'ppd'"):
        load_artifact(path, "ppd", tiny)
    with pytest.raises(SpecbenchError, match="does not exist"):
        load_artifact(tmp_path / "missing.safetensors", "medusa", tiny)
    (tmp_path / "a.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(SpecbenchError, match="not a specbench drafter artifact"):
        load_artifact(path, "medusa", tiny)
    (tmp_path / "b.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(SpecbenchError, match="not a specbench drafter artifact"):
        load_artifact(tmp_path / "b.safetensors", "medusa", tiny)


# --- self-distillation and the feature cache ---------------------------------------------------------------------

FEATURES = (1, -1)  # a middle layer and the final normed state of the 2-layer tiny model


def distill(tiny, path, count: int, layers=FEATURES, batch_size: int = 3):
    """The cache's records by conversation index after self-distilling the first `count` conversations."""
    from specbench.training.self_distill import generate_responses, read_cache

    generate_responses(tiny, read_sharegpt(count), path, max_prompt_tokens=24, max_new_tokens=10,
                       batch_size=batch_size, layers=layers)
    return sorted(read_cache(path), key=lambda r: r["index"])


def features(tiny, path, layers=FEATURES) -> dict:
    """{(conversation index, layer): its feature rows} from the cache's feature store."""
    from specbench.training.features import FeatureStore
    from specbench.training.self_distill import feature_dir, read_cache

    cfg, records = tiny.model.config, read_cache(path)
    store = FeatureStore(feature_dir(path), cfg.hidden_size, cfg.num_hidden_layers,
                         [len(r["prompt"]) + len(r["response"]) for r in records])
    return {(r["index"], layer): store.read(layer, row, len(r["prompt"]) + len(r["response"]) - 1).float()
            for row, r in enumerate(records) for layer in layers}


def assert_same_features(got: dict, want: dict) -> None:
    import torch

    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=0.05, rtol=0.02)


def test_self_distillation_writes_greedy_responses_and_the_features_of_every_fed_position(tiny, tmp_path):
    """Batches of unequal, left-padded prompts (sorted by length): each response is the target's own greedy decoding
    of its prompt alone, and each feature row is the target's hidden state at that position."""
    import torch

    from specbench.acceptance.exact import ExactAcceptance
    from specbench.decoding import Decoder
    from specbench.drafters.plain import PlainDrafter
    from specbench.sampling import SamplingParams
    from specbench.training.sharegpt import prompt_ids

    records = distill(tiny, tmp_path / "sd.jsonl", 7)
    assert [r["index"] for r in records] == list(range(7)) and len({len(r["prompt"]) for r in records}) > 1
    assert [r["prompt"] for r in records] == [prompt_ids(tiny.tokenizer, c, 24) for c in read_sharegpt(7)]
    want = {}
    for r in records:
        alone = Decoder(tiny.model, PlainDrafter(), ExactAcceptance(), SamplingParams(), 10,
                        eos_token_ids=tiny.eos_token_ids).generate(r["prompt"]).tokens
        assert r["response"] == alone
        with torch.no_grad():
            out = tiny.model.model(input_ids=torch.tensor([r["prompt"] + r["response"]]),
                                   output_hidden_states=FEATURES)
        want |= {(r["index"], layer): out.hidden_states[layer][0, :-1] for layer in FEATURES}
    assert_same_features(features(tiny, tmp_path / "sd.jsonl"), want)


def test_an_interrupted_self_distillation_resumes_where_it_stopped(tiny, tmp_path):
    """A crash after a batch's features were written but before its response lines (and one mid-line) loses nothing
    and duplicates nothing: the cache then holds what an uninterrupted run writes."""
    from specbench.training.features import FeatureStore
    from specbench.training.self_distill import feature_dir

    whole = distill(tiny, tmp_path / "a" / "sd.jsonl", 8)
    path = tmp_path / "b" / "sd.jsonl"
    distill(tiny, path, 5)
    store = FeatureStore(feature_dir(path), tiny.model.config.hidden_size, 2, [])
    with path.open("a") as fh:
        fh.write('{"index": 6, "prompt": [1, 2')  # the line being written when it died
    for layer in FEATURES:  # features of responses whose lines were never written
        with store.path(layer).open("ab") as fh:
            fh.write(b"\x01\x02" * tiny.model.config.hidden_size * 9)
    assert distill(tiny, path, 8) == whole
    assert_same_features(features(tiny, path), features(tiny, tmp_path / "a" / "sd.jsonl"))


def test_a_hidden_state_asked_for_later_is_computed_for_the_cached_responses(tiny, tmp_path):
    whole = distill(tiny, tmp_path / "a" / "sd.jsonl", 6)
    path = tmp_path / "b" / "sd.jsonl"
    assert distill(tiny, path, 4, layers=(-1,)) == whole[:4]
    assert distill(tiny, path, 6) == whole  # layer 1 filled by a forward over 4 responses, then generated for 2
    assert_same_features(features(tiny, path), features(tiny, tmp_path / "a" / "sd.jsonl"))


def test_batches_carry_the_cached_features_of_their_sequences(tiny, tmp_path):
    import torch

    from specbench.training.datamodule import ShareGPTDataModule
    from specbench.training.medusa import MedusaModule

    module = MedusaModule(tiny.model, num_heads=2)
    data = ShareGPTDataModule(tiny.tokenizer, num_conversations=9, num_val=3, max_length=64, batch_size=4,
                              self_distill={"max_prompt_tokens": 24, "max_new_tokens": 12, "dtype": "float32",
                                            "batch_size": 4}, generator=tiny, cache_dir=tmp_path)
    data.trainer = type("T", (), {"lightning_module": module})()
    data.prepare_data()
    data.setup("fit")
    batch = data.collate(data.train_set[:3])
    with torch.no_grad():
        out = tiny.model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    for i, e in enumerate(data.train_set[:3]):
        n = len(e.input_ids) - 1
        torch.testing.assert_close(batch["hidden"][-1][i, :n].float(), out.last_hidden_state[i, :n],
                                   atol=0.05, rtol=0.02)
        assert not batch["hidden"][-1][i, n:].any()


LOADER_WORKERS = """
import sys

import torch

from specbench.models.tiny import tiny_random
from specbench.training.datamodule import ShareGPTDataModule
from specbench.training.medusa import MedusaModule

torch.set_num_threads(1)
tiny = tiny_random(dtype="float32")
module = MedusaModule(tiny.model, num_heads=2)
loaders = {}
for workers in (0, 2):
    data = ShareGPTDataModule(tiny.tokenizer, num_conversations=9, num_val=3, max_length=64, batch_size=4,
                              self_distill={"max_prompt_tokens": 24, "max_new_tokens": 12, "dtype": "float32",
                                            "batch_size": 4}, generator=tiny, cache_dir=sys.argv[1],
                              num_workers=workers)
    data.trainer = type("T", (), {"lightning_module": module})()
    data.prepare_data()
    data.setup("fit")
    loaders[workers] = list(data.val_dataloader())
assert len(loaders[0]) == len(loaders[2]) > 0
for a, b in zip(loaders[0], loaders[2]):
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["hidden"][-1], b["hidden"][-1])
print("the same", len(loaders[0]), "batches")
"""


@pytest.mark.slow
def test_loader_workers_read_the_same_cached_features_as_the_training_process(tmp_path):
    """num_workers > 0 (a GPU trainer's setting) reads the feature memmaps in forked processes: the batches must be
    the ones the training process itself would read. In a fresh interpreter: an xdist worker that has run OpenVINO's
    int4 route for another test (test_backends' w4a8 one) segfaulted when this test forked it."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LOADER_WORKERS, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the same" in done.stdout


def test_a_bad_worker_count_is_one_clear_error(tiny):
    from specbench.training.datamodule import ShareGPTDataModule

    with pytest.raises(SpecbenchError, match="num_workers=-1 is invalid"):
        ShareGPTDataModule(tiny.tokenizer, num_conversations=9, num_val=3, num_workers=-1)


def test_without_the_feature_cache_the_module_computes_the_features_a_cached_batch_carries(tiny, tmp_path):
    """train.data.feature_cache=false: no features are written, batches carry none, and the module's own forward of
    the frozen target gives EAGLE the states the cache would have held (bf16 rows: to bf16 rounding), so the loss is
    the cached run's."""
    import torch

    from specbench.training.datamodule import ShareGPTDataModule
    from specbench.training.eagle import EagleModule
    from specbench.training.self_distill import feature_dir

    module = EagleModule(tiny.model, features="fused", draft_vocab=None, ttt_steps=2)
    batches = {}
    for cached in (True, False):
        data = ShareGPTDataModule(tiny.tokenizer, num_conversations=9, num_val=3, max_length=64, batch_size=4,
                                  self_distill={"max_prompt_tokens": 24, "max_new_tokens": 12, "dtype": "float32",
                                                "batch_size": 4}, generator=tiny, cache_dir=tmp_path / str(cached),
                                  feature_cache=cached)
        data.trainer = type("T", (), {"lightning_module": module})()
        data.prepare_data()
        data.setup("fit")
        batches[cached] = data.collate(data.train_set[:3])
        assert feature_dir(data._cache()).exists() == cached
    assert "hidden" not in batches[False] and torch.equal(batches[True]["input_ids"], batches[False]["input_ids"])
    computed = module.target_states(batches[False])
    assert computed.keys() == batches[True]["hidden"].keys()
    for i, length in enumerate(batches[True]["attention_mask"].sum(-1).tolist()):
        for layer, rows in computed.items():
            torch.testing.assert_close(rows[i, : length - 1].float(), batches[True]["hidden"][layer][i, : length - 1]
                                       .float(), atol=0.05, rtol=0.02)
    with torch.no_grad():
        losses = [module.training_step(batches[cached], 0) for cached in (True, False)]
    torch.testing.assert_close(losses[0], losses[1], atol=0.05, rtol=0.02)


def test_turns_all_answers_every_distinct_user_turn_of_the_held_in_conversations_only(monkeypatch):
    from specbench.data import prompts

    chats = [[{"role": "user", "content": f"question number {i} about something"},
              {"role": "assistant", "content": "an answer"},
              {"role": "user", "content": "continue"},  # too short to ask anything alone
              {"role": "user", "content": f"question number {i} about something"}]  # a repeat
             for i in range(prompts.HELD_OUT_FROM + 5)]
    chats[1][2] = {"role": "user", "content": "a follow-up turn long enough to stand alone"}
    monkeypatch.setattr(prompts, "read_sharegpt", lambda n: chats[:n])
    got = [c[0]["content"] for c in prompts.training_prompts("all", prompts.HELD_OUT_FROM + 1)]
    assert got[:3] == ["question number 0 about something", "question number 1 about something",
                       "a follow-up turn long enough to stand alone"]
    assert len(got) == len(set(got)) == prompts.HELD_OUT_FROM + 1
    assert f"question number {prompts.HELD_OUT_FROM} about something" not in got  # the held-out conversations' turn
    with pytest.raises(SpecbenchError, match=r"num_conversations=10002 is more prompts than turns=all holds: 10,001"):
        prompts.training_prompts("all", prompts.HELD_OUT_FROM + 2)
    with pytest.raises(SpecbenchError, match=r"num_conversations=10001 is invalid: ShareGPT's conversations from "
                                             r"10,000 on are evaluation prompts"):
        prompts.training_prompts("first", prompts.HELD_OUT_FROM + 1)
