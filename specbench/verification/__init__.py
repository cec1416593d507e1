"""One target forward over [root + tree] on top of the KV cache, and committing the accepted path into it."""

from specbench.verification.batch_forward import (batch_tree_mask, commit_batch, keep_sequences, prefill_batch,
                                                  verify_batch)
from specbench.verification.kv_cache import cache_bytes, commit_path, new_cache
from specbench.verification.tree_forward import (VerifyOutput, selected_hidden, tree_attention_mask, verified_tree,
                                                 verify_tree)

__all__ = ["VerifyOutput", "batch_tree_mask", "cache_bytes", "commit_batch", "commit_path", "keep_sequences",
           "new_cache", "prefill_batch", "selected_hidden", "tree_attention_mask", "verified_tree", "verify_batch",
           "verify_tree"]
