"""task=datastore: tokenise ShareGPT with the target's tokenizer and save SSSD's suffix-array index, once per model."""

from __future__ import annotations

import time
from pathlib import Path

from specbench.data.datastore import Datastore, default_path, sharegpt_documents
from specbench.tasks._common import build_model


def run(cfg) -> Path:
    settings = cfg.datastore
    target = build_model(cfg.model, dtype="float32")  # only the tokenizer is used; loading from the cache takes ~1 s
    path = Path(settings.path).expanduser() if settings.get("path") else default_path(target.name)
    start = time.perf_counter()
    documents = sharegpt_documents(target.tokenizer, settings.num_conversations, target.chat_template)
    tokenised = time.perf_counter()
    print(f"building the suffix array over {sum(map(len, documents)):,} tokens (one pass, no progress to show)")
    store = Datastore.build(documents, target.tokenizer, target.name, corpus="sharegpt",
                            num_conversations=settings.num_conversations, chat_template=target.chat_template)
    store.save(path)
    done = time.perf_counter()
    print(f"datastore for {target.name}: {len(store):,} tokens from {len(documents):,} ShareGPT conversations; "
          f"read + tokenise {tokenised - start:.1f} s, suffix array + save {done - tokenised:.1f} s, "
          f"{path.stat().st_size / 2**20:.1f} MiB at {path}")
    return path
