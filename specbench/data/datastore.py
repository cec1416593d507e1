"""SSSD's datastore: a suffix array over a tokenised corpus, searched for continuations of the context's last tokens.

The suffix array comes from pydivsufsort (libdivsufsort). The search is a lexicographic binary search written here
(bisect with a key) because pydivsufsort's sa_search only takes byte strings, and our tokens are 16/32-bit ids.
Documents are joined with a separator id outside the vocabulary, so no continuation runs from one into the next.
One index file (.npz) holds the tokens, the suffix array and a JSON record: the tokenizer's fingerprint, the model
name and the build settings.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from pydivsufsort import divsufsort
from tqdm.auto import tqdm

from specbench.data.prompts import HELD_OUT_FROM
from specbench.errors import SpecbenchError
from specbench.models.loading import cache_root

log = logging.getLogger(__name__)


@dataclass
class TrieNode:
    """How many of the looked-up continuations pass through this token, and what follows it."""

    count: int = 0
    children: dict[int, "TrieNode"] = field(default_factory=dict)


def count_trie(rows: Iterable[Sequence[int]], stop: int | None = None) -> dict[int, TrieNode]:
    """The children of a prefix: each row is one continuation, read until the `stop` token."""
    root: dict[int, TrieNode] = {}
    for row in rows:
        level = root
        for token in row:
            if token == stop:
                break
            node = level.setdefault(token, TrieNode())
            node.count += 1
            level = node.children
    return root


def spread(n: int, samples: int) -> np.ndarray:
    """Up to `samples` indices into range(n) at regular intervals: on a sorted range they keep its distribution."""
    return np.arange(n) if n <= samples else (np.arange(samples) * n) // samples


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the sorted vocabulary: datastores built by tokenizers with the same ids are interchangeable."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha1(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def default_path(model_name: str) -> Path:
    """Where task=datastore saves the ShareGPT index of a model and method=sssd looks for it."""
    return cache_root() / "datastores" / model_name / "sharegpt.npz"


class Datastore:
    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, meta: dict) -> None:
        self.tokens, self.suffix_array, self.meta = tokens, suffix_array, meta
        self.separator = int(meta["separator"])

    @classmethod
    def build(cls, documents: Iterable[Sequence[int]], tokenizer, model_name: str, **settings) -> "Datastore":
        """Index the documents (token lists); every document ends with the separator (the vocabulary size)."""
        separator = len(tokenizer)
        parts = [np.append(np.asarray(doc, dtype=np.int64), separator) for doc in documents]
        if not parts:
            raise SpecbenchError("the datastore needs at least one document; got none")
        dtype = np.uint16 if separator < 2**16 else np.int32
        tokens = np.concatenate(parts).astype(dtype)
        meta = {"model": model_name, "tokenizer": tokenizer_fingerprint(tokenizer), "separator": separator,
                "documents": len(parts), **settings}
        return cls(tokens, divsufsort(tokens), meta)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, tokens=self.tokens, suffix_array=self.suffix_array, meta=np.array(json.dumps(self.meta)))
        tmp.replace(path)  # atomic: a half-written index is never picked up

    @classmethod
    def load(cls, path: Path, tokenizer, model_name: str) -> "Datastore":
        """The index at path, checked against the tokenizer that will read its token ids. A file cut short, ids the
        tokenizer lacks or a suffix array that does not fit the tokens would otherwise fail mid-decoding with a
        traceback (an id past the embedding) or draft garbage silently, so each is one line: rebuild the index."""
        build_cmd = f"`python run.py task=datastore model={model_name}`"

        def broken(problem: str) -> SpecbenchError:
            return SpecbenchError(f"the SSSD datastore '{path}' {problem}; rebuild it with {build_cmd}")

        if not path.exists():
            raise SpecbenchError(f"the SSSD datastore '{path}' does not exist; build it with {build_cmd}")
        try:
            with np.load(path, allow_pickle=False) as data:
                tokens, suffix_array, meta = data["tokens"], data["suffix_array"], json.loads(str(data["meta"]))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise broken(f"is not a specbench datastore (cut short or corrupt: {exc})") from exc
        missing = [k for k in ("model", "tokenizer", "separator") if not isinstance(meta, dict) or k not in meta]
        if missing:
            raise broken(f"lacks {', '.join(missing)} in its meta record")
        if meta["tokenizer"] != tokenizer_fingerprint(tokenizer):
            raise broken(f"was built for another tokenizer (model {meta['model']})")
        separator = meta["separator"]
        if separator != len(tokenizer) or isinstance(separator, bool):
            raise broken(f"has separator id {separator!r}, not the tokenizer's vocabulary size {len(tokenizer)}")
        for name, array in (("tokens", tokens), ("suffix_array", suffix_array)):
            if array.ndim != 1 or array.dtype.kind not in "iu" or not len(array):
                raise broken(f"holds {name} of shape {array.shape} and dtype {array.dtype}, not a non-empty list "
                             f"of integer ids")
        if tokens.min() < 0 or tokens.max() > separator or tokens[-1] != separator:
            outside = tokens[(tokens < 0) | (tokens > separator)]
            raise broken(f"holds token id {outside[0]} outside the vocabulary 0..{separator - 1}" if len(outside)
                         else f"does not end with its separator id {separator} (cut short)")
        if len(suffix_array) != len(tokens) or suffix_array.min() < 0 or suffix_array.max() >= len(tokens):
            raise broken(f"has a suffix array of {len(suffix_array)} positions in {suffix_array.min()}.."
                         f"{suffix_array.max()} for {len(tokens)} tokens: it needs one position in "
                         f"0..{len(tokens) - 1} per token")
        return cls(tokens, suffix_array, meta)

    def __len__(self) -> int:
        return len(self.tokens)

    def match_range(self, pattern: Sequence[int]) -> tuple[int, int]:
        """[lo, hi): the suffix-array rows whose suffixes start with pattern."""
        pattern, k, tokens = list(pattern), len(pattern), self.tokens

        def key(start):
            return tokens[start: start + k].tolist()

        lo = bisect.bisect_left(self.suffix_array, pattern, key=key)
        return lo, bisect.bisect_right(self.suffix_array, pattern, lo=lo, key=key)

    def lookup(self, context: Sequence[int], max_prefix: int, min_count: int, samples: int,
               depth: int) -> tuple[int, dict[int, TrieNode]]:
        """Continuations (up to `depth` tokens) of the context's last max_prefix tokens, then of shorter suffixes
        until min_count matches are found; `samples` spread over each match range, merged into one count trie.
        Returns (continuations merged, trie): a node's count over the first is its path's pseudo-probability."""
        rows, matches = [], 0
        for k in range(min(max_prefix, len(context)), 0, -1):
            lo, hi = self.match_range(context[-k:])
            if hi > lo:
                starts = self.suffix_array[lo + spread(hi - lo, samples)].astype(np.int64) + k
                index = np.minimum(starts[:, None] + np.arange(depth), len(self.tokens) - 1)  # ends on a separator
                rows.extend(self.tokens[index].tolist())
                matches += hi - lo
            if matches >= min_count:
                break
        return len(rows), count_trie(rows, stop=self.separator)


def sharegpt_documents(tokenizer, num_conversations: int, chat_template: bool) -> list[list[int]]:
    """The first num_conversations ShareGPT conversations as token lists, through the chat template when the model
    uses one (so the store holds the same turn markers that precede an answer at decode time)."""
    from specbench.data.sharegpt import read_sharegpt

    if not isinstance(num_conversations, int) or not 1 <= num_conversations <= HELD_OUT_FROM:
        raise SpecbenchError(f"datastore.num_conversations={num_conversations!r} is invalid: it must be an integer in "
                             f"1..{HELD_OUT_FROM}, so the held-out ShareGPT evaluation prompts stay out of the store")
    conversations = read_sharegpt(num_conversations)
    templated = chat_template and getattr(tokenizer, "chat_template", None)
    documents = []
    bar = tqdm(total=len(conversations), desc="tokenising ShareGPT", unit="conversation", dynamic_ncols=True)
    for start in range(0, len(conversations), 256):  # chunks only to show progress: each call stays batched
        chunk = conversations[start: start + 256]
        if templated:
            texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in chunk]
            documents += tokenizer(texts, add_special_tokens=False)["input_ids"]
        else:
            documents += tokenizer(["\n\n".join(m["content"] for m in c) for c in chunk])["input_ids"]
        bar.update(len(chunk))
    bar.close()
    return documents


def build_sharegpt(tokenizer, model_name: str, chat_template: bool, num_conversations: int, path: Path) -> Path:
    """Tokenise the first num_conversations ShareGPT conversations and save their index at path: task=datastore, or
    method=sssd the first time it runs on a model with no index at the default path (a one-time artifact, like the
    GGUF conversion)."""
    start = time.perf_counter()
    documents = sharegpt_documents(tokenizer, num_conversations, chat_template)
    tokenised = time.perf_counter()
    print(f"building the suffix array over {sum(map(len, documents)):,} tokens (one pass, no progress to show)")
    store = Datastore.build(documents, tokenizer, model_name, corpus="sharegpt", num_conversations=num_conversations,
                            chat_template=chat_template)
    store.save(path)
    done = time.perf_counter()
    log.info("datastore for %s: %s tokens from %s ShareGPT conversations; read + tokenise %.1f s, suffix array + save "
             "%.1f s, %.1f MiB at %s", model_name, f"{len(store):,}", f"{len(documents):,}", tokenised - start,
             done - tokenised, path.stat().st_size / 2**20, path)
    return path


def load_or_build(path: Path | None, tokenizer, model_name: str, chat_template: bool) -> Datastore:
    """The index at path; with path None, the model's default index, built first (the default corpus size) when it
    is not there yet. An index a user named is never built in its place: a missing one is an error."""
    if path is None and not default_path(model_name).exists():
        log.warning("method=sssd: no datastore for %s yet; building it once from %d ShareGPT conversations (about a "
                    "minute; `python run.py task=datastore` builds it ahead)", model_name, HELD_OUT_FROM)
        build_sharegpt(tokenizer, model_name, chat_template, HELD_OUT_FROM, default_path(model_name))
    return Datastore.load(path or default_path(model_name), tokenizer, model_name)
