"""One target forward over [root + tree] on top of the KV cache, and committing the accepted path into it."""

from specbench.verification.kv_cache import cache_bytes, commit_path
from specbench.verification.tree_forward import VerifyOutput, tree_attention_mask, verify_tree

__all__ = ["VerifyOutput", "cache_bytes", "commit_path", "tree_attention_mask", "verify_tree"]
