"""task=datastore: tokenise ShareGPT with the target's tokenizer and save SSSD's suffix-array index, once per model
(method=sssd also builds the default one on first use)."""

from __future__ import annotations

from pathlib import Path

from specbench.data.datastore import build_sharegpt, default_path
from specbench.tasks._common import build_model


def run(cfg) -> Path:
    settings = cfg.datastore
    target = build_model(cfg.model, dtype="float32")  # only the tokenizer is used; loading from the cache takes ~1 s
    path = Path(settings.path).expanduser() if settings.get("path") else default_path(target.name)
    build_sharegpt(target.tokenizer, target.name, target.chat_template, settings.num_conversations, path)
    print(f"datastore for {target.name} saved at {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return path
