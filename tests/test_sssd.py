"""SSSD: n-gram counts and scores by hand, datastore lookups, lossless greedy decoding, the budget, bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydivsufsort import divsufsort

from specbench.acceptance import ExactAcceptance
from specbench.data.datastore import Datastore, TrieNode, count_trie, spread
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.base import DecodeState
from specbench.drafters.sssd import InputIndex, SSSDDrafter
from specbench.errors import SpecbenchError
from specbench.models.tiny import byte_tokenizer
from specbench.sampling import SamplingParams
from specbench.trees.sized import paying_size
from specbench.trees.native import NativePolicy

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["the cat sat on the mat and the cat sat on the hat", "abc abc abc abd abc", "x", "hello world " * 6]


def decode(tiny, drafter, prompt, max_new=48):
    return Decoder(tiny.model, drafter, ExactAcceptance(), SamplingParams(), max_new, tiny.eos_token_ids,
                   max_context=tiny.max_context).generate(prompt)


def flat(trie):
    """{path: count} of a count trie."""
    out = {}
    for token, node in trie.items():
        out[(token,)] = node.count
        out.update({(token, *path): c for path, c in flat(node.children).items()})
    return out


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def store_path(tiny, prompts, tmp_path_factory):
    """A datastore of a few strings plus what the tiny model writes after the test prompts, so its drafts match."""
    docs = [tiny.tokenizer(t)["input_ids"] for t in ("a few strings", "for the datastore")]
    docs += [p + decode(tiny, PlainDrafter(), p).tokens for p in prompts]
    path = tmp_path_factory.mktemp("ds") / "tiny.npz"
    Datastore.build(docs, tiny.tokenizer, tiny.name).save(path)
    return path


def test_input_ngram_counts_by_hand():
    tokens = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    index = InputIndex(max_prefix=2)
    index.extend(tokens[:5])
    index.extend(tokens)  # incremental: only the new tokens are indexed
    assert index.follows[(1, 2)] == [2, 5, 8, 11] and index.follows[(2,)] == [2, 5, 8, 11]
    assert index.follows[(2, 3)] == [3, 6] and (2, 3, 1) not in index.follows
    total, trie = index.lookup(k=2, depth=2, samples=100)  # the last occurrence has no continuation yet
    assert total == 3 and flat(trie) == {(3,): 2, (3, 1): 2, (4,): 1, (4, 1): 1}


def test_input_scores_and_greedy_tree_by_hand(tiny):
    """Scores (scale * count / total * 0.9 ** (depth - 1)), k=2: scale 0.5, k=1: scale 0.5 * 0.8:
    3 (k2) .333, 3-1 (k2) .300, 3 (k1) .267 merged, 3-1 (k1) .240 merged, 4 (k2) .167, 4-1 (k2) .150, ..."""
    tokens = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    knobs = dict(sources=["input"], input_max_prefix=2, branch_len=2, input_discount=0.5, match_discount=0.8,
                 depth_discount=0.9)
    for budget, want_tokens, want_parents in [(3, [2, 3, 1], [-1, 0, 1]), (4, [2, 3, 1, 4], [-1, 0, 1, 0]),
                                              (32, [2, 3, 1, 4, 1], [-1, 0, 1, 0, 3])]:
        drafter = SSSDDrafter(tiny, NativePolicy(budget), **knobs)
        state = DecodeState(tokens=list(tokens), prompt_len=len(tokens))
        drafter.reset(state)
        tree = drafter.propose(state)
        assert tree.tokens.tolist() == want_tokens and tree.parents.tolist() == want_parents


def test_datastore_lookup_counts_on_a_hand_made_corpus(tiny, tmp_path):
    docs = [[10, 11, 12, 10, 11, 13], [10, 11, 12, 14]]
    store = Datastore.build(docs, tiny.tokenizer, tiny.name)
    sep = len(tiny.tokenizer)
    assert store.tokens.tolist() == [10, 11, 12, 10, 11, 13, sep, 10, 11, 12, 14, sep]
    assert store.match_range([10, 11])[1] - store.match_range([10, 11])[0] == 3
    assert store.match_range([11, 10])[1] == store.match_range([11, 10])[0]
    # the longest suffix with enough matches; continuations stop at a document's end
    total, trie = store.lookup([5, 10, 11], max_prefix=2, min_count=1, samples=100, depth=2)
    assert total == 3 and flat(trie) == {(12,): 2, (12, 10): 1, (12, 14): 1, (13,): 1}
    # 12 10 11 matches once, below min_count=2: back off to 10 11 and merge the counts
    total, trie = store.lookup([12, 10, 11], max_prefix=3, min_count=2, samples=100, depth=1)
    assert total == 4 and flat(trie) == {(13,): 2, (12,): 2}
    assert store.lookup([99], max_prefix=4, min_count=1, samples=100, depth=3) == (0, {})
    path = tmp_path / "ds.npz"
    store.save(path)
    loaded = Datastore.load(path, tiny.tokenizer, tiny.name)
    assert (loaded.suffix_array == store.suffix_array).all() and loaded.meta == store.meta


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_match_range_finds_exactly_the_suffixes_starting_with_the_pattern(dtype):
    """The packed-key search (numpy over each suffix's first tokens, then bisect over the rest) against a brute-force
    scan: patterns shorter than, as long as and longer than a key's tokens, found or not, near the array's end too.
    A small vocabulary makes long shared prefixes; int32 ids pack two to a key, uint16 four."""
    rng = np.random.default_rng(0)
    separator = 7 if dtype == np.uint16 else 70_000  # int32 stores hold ids past 16 bits
    docs = [rng.integers(0, 4, rng.integers(1, 40)) for _ in range(30)]
    if dtype == np.int32:
        docs = [np.where(d == 3, 66_000, d) for d in docs]
    tokens = np.concatenate([np.append(d, separator) for d in docs]).astype(dtype)
    store = Datastore(tokens, divsufsort(tokens), {"separator": separator})
    text = tokens.tolist()
    patterns = [text[i: i + k] for i in rng.integers(0, len(text) - 12, 60) for k in range(1, 11)]
    patterns = [p for p in patterns if separator not in p] + [list(rng.integers(0, 3, k)) for k in range(1, 9)]
    for pattern in patterns:
        lo, hi = store.match_range(pattern)
        starts = sorted(store.suffix_array[lo:hi].tolist())
        assert starts == [i for i in range(len(text)) if text[i: i + len(pattern)] == pattern], pattern


def test_samples_spread_over_the_match_range():
    assert spread(10, 5).tolist() == [0, 2, 4, 6, 8] and spread(3, 5).tolist() == [0, 1, 2]
    assert flat(count_trie([[1, 2], [1, 3], [1, 9, 4]], stop=9)) == {(1,): 3, (1, 2): 1, (1, 3): 1}


def test_a_trie_of_repeated_rows_is_the_row_by_row_trie_in_the_same_order():
    """Equal rows are walked once with their count: counts, paths and every level's child order are those of a walk
    row by row (the best-first draft pops equal scores in that order), stop tokens included."""
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 4, size=3).tolist() for _ in range(12)] * 3 + [[2, 9, 1], [9, 2], [2, 9, 3]]
    rng.shuffle(rows)

    def by_row(rows, stop):
        root = {}
        for row in rows:
            level = root
            for token in row:
                if token == stop:
                    break
                node = level.setdefault(token, TrieNode())
                node.count += 1
                level = node.children
        return root

    for stop in (None, 9, 2):
        assert list(flat(count_trie(rows, stop=stop)).items()) == list(flat(by_row(rows, stop)).items())


@pytest.mark.parametrize("sources", [["input"], ["datastore"], ["input", "datastore"]])
def test_sssd_greedy_equals_plain_decoding(tiny, prompts, store_path, sources):
    accepted = 0
    for prompt in prompts:
        ar = decode(tiny, PlainDrafter(), prompt)
        out = decode(tiny, SSSDDrafter(tiny, NativePolicy(16), sources=sources, datastore=str(store_path)), prompt)
        assert out.tokens == ar.tokens
        assert all(s.tree_size <= 16 for s in out.steps)
        accepted += sum(s.accepted for s in out.steps)
    assert accepted > 0  # the drafts were really accepted


@pytest.mark.parametrize("budget", [2, 5, 32])
def test_the_tree_respects_the_budget(tiny, prompts, store_path, budget):
    drafter = SSSDDrafter(tiny, NativePolicy(budget), datastore=str(store_path))
    sizes = [s.tree_size for p in prompts for s in decode(tiny, drafter, p, max_new=24).steps]
    assert max(sizes) <= budget and (budget == 32 or max(sizes) == budget)


def sized_tree_sizes(target, make_drafter, prompts, latency_ms, decode):
    """Each step's tree size over the prompts, decoded by a sized drafter fit to `latency_ms`, every answer checked
    against plain decoding's; and the drafter."""
    drafter = make_drafter(sized=True)
    drafter.fit(latency_ms)
    sizes = []
    for prompt in prompts:
        gen = decode(target, drafter, prompt)
        assert gen.tokens == decode(target, PlainDrafter(), prompt).tokens
        sizes += [s.tree_size for s in gen.steps]
    return sizes, drafter


FLAT, STEEP = (lambda n: 10.0), (lambda n: 10.0 + 6.0 * (n - 1))  # L(n): rows free; a row 0.6 of a one-row step


def test_a_sized_tree_is_lossless_and_drafts_as_the_step_costs_pay(tiny, prompts, store_path):
    """On a flat L(n) every candidate pays, so the sized tree is the full one; where each row costs 0.6 of a
    one-row step, only nodes accepted more than 60% of the time pay, so trees shrink."""
    def make(**sized):
        return SSSDDrafter(tiny, NativePolicy(8), datastore=str(store_path), **sized)

    unsized = [s.tree_size for p in prompts for s in decode(tiny, make(), p).steps]
    flat_sizes, _ = sized_tree_sizes(tiny, make, prompts, FLAT, decode)
    steep_sizes, drafter = sized_tree_sizes(tiny, make, prompts, STEEP, decode)
    assert np.mean(flat_sizes) == pytest.approx(np.mean(unsized), rel=0.2)
    assert np.mean(steep_sizes) < np.mean(flat_sizes)
    assert 0 < sum(drafter.sizer.acceptance.accepted) <= sum(drafter.sizer.acceptance.judged)


def test_a_sized_tree_drafts_nothing_where_its_scores_were_never_accepted(tiny, store_path):
    drafter = SSSDDrafter(tiny, NativePolicy(8), datastore=str(store_path), sized=True)
    drafter.fit(lambda n: 10.0 + (n - 1))  # a row costs a tenth of a step

    def size(buckets):
        return paying_size([drafter.sizer.acceptance.expected(b) for b in buckets], drafter.sizer.step_ms)

    buckets = [0, 0, 0, 1, 1, 2, 2]  # scores 0.71 to 1, 0.5 to 0.71, 0.35 to 0.5
    assert size(buckets) == 8  # on their scores alone, all seven nodes pay
    drafter.sizer.acceptance.record([0, 1, 2] * 1000, [False] * 3000)
    assert size(buckets) == 1
    drafter.sizer.acceptance.record([0] * 5000, [True] * 5000)
    assert size(buckets) == 4  # only the nodes of the bucket the verify accepted
    drafter.forget()  # what the evaluator does before it relearns a resumed folder's answers
    assert size(buckets) == 8 and drafter.learns_across_answers


@pytest.mark.parametrize("budget", [2, 4, 9])
def test_reading_continuations_no_deeper_than_the_tree_can_reach_keeps_every_tree(tiny, prompts, store_path, budget):
    """The tries are read budget - 1 deep (a tree of `budget` nodes reaches no deeper), so branch_len beyond that
    changes no proposal: each step's tree equals that of a drafter whose continuations stop at budget - 1."""
    deep = SSSDDrafter(tiny, NativePolicy(budget), datastore=str(store_path), branch_len=40)
    reads = []
    lookup = deep.store.lookup
    deep.store.lookup = lambda *a: reads.append(a[-1]) or lookup(*a)
    short = SSSDDrafter(tiny, NativePolicy(budget), datastore=str(store_path), branch_len=budget - 1)
    for prompt in prompts:
        state = DecodeState(tokens=list(prompt), prompt_len=len(prompt))
        deep.reset(state)
        short.reset(state)
        for token in decode(tiny, PlainDrafter(), prompt, max_new=16).tokens:
            a, b = deep.propose(state), short.propose(state)
            assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
            state.tokens.append(token)
    assert reads and set(reads) == {budget - 1}


def test_a_missing_datastore_says_how_to_build_it(tiny, tmp_path):
    with pytest.raises(SpecbenchError, match=r"does not exist; build it with `python run.py task=datastore "
                                             r"model=tiny_random`"):
        SSSDDrafter(tiny, NativePolicy(8), datastore=str(tmp_path / "none.npz"))
    SSSDDrafter(tiny, NativePolicy(8), sources=["input"], datastore=str(tmp_path / "none.npz"))  # not needed


def test_the_default_datastore_is_built_on_first_use_and_reused(tiny, prompts, tmp_path, monkeypatch, caplog):
    """method=sssd on a fresh cache builds the model's default index once (a one-time artifact, like the GGUF
    conversion) instead of ending in an error; a second drafter reads it without building. An index the user named
    is never built in its place (test above)."""
    import specbench.data.prompts as prompt_data
    from specbench.data.datastore import default_path

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    chats = [[{"role": "user", "content": p}, {"role": "assistant", "content": p[::-1]}] for p in
             ["the cat sat on the mat", "a dog ran after the cat", "the mat was red and the cat was grey"]]
    calls = []
    monkeypatch.setattr(prompt_data, "read_sharegpt", lambda n: calls.append(n) or chats)
    drafter = SSSDDrafter(tiny, NativePolicy(8), datastore=None)
    assert calls == [10000] and default_path(tiny.name).exists() and "building it once" in caplog.text
    assert len(drafter.store) > 0
    SSSDDrafter(tiny, NativePolicy(8), datastore=None)
    assert calls == [10000]  # read from the cache the second time
    ar = decode(tiny, PlainDrafter(), prompts[0])
    assert decode(tiny, drafter, prompts[0]).tokens == ar.tokens


@pytest.mark.slow
def test_a_run_that_builds_the_datastore_resumes_into_its_own_folder(tmp_path, monkeypatch):
    """The datastore a run builds on first use is fingerprinted in its settings as built: a rerun into the same
    folder resumes instead of being refused for a datastore that was 'missing' when the settings were written."""
    import specbench.data.prompts as prompt_data
    from specbench.tasks import eval as eval_task

    from .conftest import compose_cfg

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    chat = [{"role": "user", "content": "the cat sat on the mat"}, {"role": "assistant", "content": "the mat sat"}]
    monkeypatch.setattr(prompt_data, "read_sharegpt", lambda n: [chat] * 3)
    overrides = ["model=tiny_random", "eval.dtype=float32", "eval.num_prompts=1", "eval.max_new_tokens=8",
                 "eval.warmup=0", "eval.memory_probe=false", "eval.fastest_plain=false", "eval.latency_profile=false",
                 "method=sssd"]
    eval_task.run(compose_cfg(overrides, tmp_path / "run"))
    settings = json.loads((tmp_path / "run" / "settings.json").read_text())
    assert "missing" not in json.dumps(settings)
    summary = eval_task.run(compose_cfg(overrides, tmp_path / "run"))  # resumes: nothing decoded again
    assert set(summary["method"]) == {"plain", "sssd"}


def test_a_datastore_for_another_tokenizer_is_refused(tiny, tmp_path):
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    Datastore.build([[1, 2, 3]], other, "other_model").save(tmp_path / "other.npz")
    with pytest.raises(SpecbenchError, match="built for another tokenizer \\(model other_model\\); rebuild it"):
        SSSDDrafter(tiny, NativePolicy(8), datastore=str(tmp_path / "other.npz"))
    (tmp_path / "junk.npz").write_text("not an index")
    with pytest.raises(SpecbenchError, match="is not a specbench datastore"):
        SSSDDrafter(tiny, NativePolicy(8), datastore=str(tmp_path / "junk.npz"))


@pytest.mark.parametrize("knob, value, valid", [
    ("sources", [], "non-empty list"), ("sources", ["input", "web"], "non-empty list"),
    ("sources", "input", "non-empty list"), ("sources", ["input", "input"], "distinct"),
    ("samples", 0, "integer >= 1"), ("min_count", 1.5, "integer >= 1"), ("branch_len", -1, "integer >= 1"),
    ("input_max_prefix", 0, "integer >= 1"), ("datastore_max_prefix", True, "integer >= 1"),
    ("input_discount", 0.0, r"in \(0, 1\]"), ("depth_discount", 1.5, r"in \(0, 1\]"),
    ("match_discount", "x", r"in \(0, 1\]"), ("sized", "yes", "true or false"),
])
def test_bad_knobs_name_the_value_and_what_is_valid(tiny, knob, value, valid):
    with pytest.raises(SpecbenchError, match=rf"sssd {knob}={value!r} is invalid: .*{valid}".replace("[", r"\[")):
        SSSDDrafter(tiny, NativePolicy(8), **{"sources": ["input"], knob: value})


@pytest.mark.slow
def test_task_datastore_end_to_end(tiny, tmp_path, monkeypatch):
    """`python run.py task=datastore` on the tiny model: it saves an index the drafter then finds by default."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPECBENCH_CACHE=str(tmp_path / "cache"))
    args = [sys.executable, "run.py", "task=datastore", "model=tiny_random", "++datastore.num_conversations=20",
            "++datastore.path=null", f"hydra.run.dir={tmp_path}/run"]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "cache" / "datastores" / "tiny_random" / "sharegpt.npz"
    assert "from 20 ShareGPT conversations" in proc.stdout and str(path) in proc.stdout
    store = Datastore.load(path, tiny.tokenizer, tiny.name)
    assert store.meta["num_conversations"] == 20 and len(store) > 1000
    suffixes = [store.tokens[i: i + 16].tolist() for i in store.suffix_array[::97]]
    assert suffixes == sorted(suffixes)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    assert SSSDDrafter(tiny, NativePolicy(8)).store.meta == store.meta  # found again at the default path
    bad = subprocess.run(args[:3] + ["model=tiny_random", "++datastore.num_conversations=0", "++datastore.path=null",
                                     f"hydra.run.dir={tmp_path}/bad"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: datastore.num_conversations=0 is invalid")


def corrupt(tiny, path, tokens=None, suffix_array=None, **meta):
    """Save a hand-made index at path: a good one's arrays and meta, with the given ones replaced."""
    good = Datastore.build([[10, 11, 12, 10, 11, 13], [10, 11, 12, 14]], tiny.tokenizer, tiny.name)
    np.savez(path, tokens=good.tokens if tokens is None else tokens,
             suffix_array=good.suffix_array if suffix_array is None else suffix_array,
             meta=np.array(json.dumps({k: v for k, v in {**good.meta, **meta}.items() if v is not None})))


SEP = len(byte_tokenizer())  # the tiny model's vocabulary size: the separator id
REBUILD = "; rebuild it with `python run.py task=datastore model=tiny_random`"


@pytest.mark.parametrize("damage, problem", [
    (lambda tiny, p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
     "is not a specbench datastore (cut short or corrupt: File is not a zip file)"),
    (lambda tiny, p: corrupt(tiny, p, tokens=np.array([10, 11, SEP + 5, 12, SEP], np.uint16),
                             suffix_array=np.arange(5, dtype=np.int32)),
     f"holds token id {SEP + 5} outside the vocabulary 0..{SEP - 1}"),
    (lambda tiny, p: corrupt(tiny, p, tokens=np.array([10, -3, 12, SEP], np.int32),
                             suffix_array=np.arange(4, dtype=np.int32)),
     f"holds token id -3 outside the vocabulary 0..{SEP - 1}"),
    (lambda tiny, p: corrupt(tiny, p, separator=SEP + 1), f"has separator id {SEP + 1}, not the tokenizer's "
                                                          f"vocabulary size {SEP}"),
    (lambda tiny, p: corrupt(tiny, p, separator=None), "lacks separator in its meta record"),
    (lambda tiny, p: corrupt(tiny, p, separator=None, tokenizer=None), "lacks tokenizer, separator in its meta record"),
    (lambda tiny, p: corrupt(tiny, p, suffix_array=np.arange(11, dtype=np.int32)),
     "has a suffix array of 11 positions in 0..10 for 12 tokens: it needs one position in 0..11 per token"),
    (lambda tiny, p: corrupt(tiny, p, suffix_array=np.arange(12, dtype=np.int32) + 3),
     "has a suffix array of 12 positions in 3..14 for 12 tokens: it needs one position in 0..11 per token"),
    (lambda tiny, p: corrupt(tiny, p, tokens=np.array([10, 11, 12], np.uint16),
                             suffix_array=np.arange(3, dtype=np.int32)),
     f"does not end with its separator id {SEP} (cut short)"),
    (lambda tiny, p: corrupt(tiny, p, suffix_array=np.zeros((2, 6), np.int32)),
     "holds suffix_array of shape (2, 6) and dtype int32, not a non-empty list of integer ids"),
])
def test_a_damaged_datastore_is_one_line_naming_the_file_and_the_rebuild(tiny, tmp_path, damage, problem):
    """A truncated index or ids the tokenizer lacks used to be a traceback (an id past the embedding mid-decoding)
    or silent garbage; each is now one SpecbenchError line."""
    path = tmp_path / "ds.npz"
    corrupt(tiny, path)
    damage(tiny, path)
    with pytest.raises(SpecbenchError) as err:
        SSSDDrafter(tiny, NativePolicy(8), datastore=str(path))
    assert str(err.value) == f"the SSSD datastore '{path}' {problem}{REBUILD}"
