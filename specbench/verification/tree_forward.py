"""Tree verification through transformers' own 4D attention-mask support (no forked model files).

A 4D boolean mask of shape (1, 1, n, past + n) with explicit position ids, on top of a DynamicCache, gives each tree
node exactly the logits of decoding its root-to-node path token by token (checked in tests/test_verification.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.trees.token_tree import TokenTree


@dataclass
class VerifyOutput:
    logits: torch.Tensor  # (n, V) float32, one row per tree node
    hidden: torch.Tensor | None  # (n, H) last hidden state per node, when a drafter reads it (Medusa, PPD); (n, k*H)
    # when it names k hidden-state indices (EAGLE-3's low, mid and high layers), see selected_hidden


def selected_hidden(out, want_hidden: bool | tuple[int, ...]) -> torch.Tensor | None:
    """(batch, n, H) the last hidden state for want_hidden=True; for a tuple of hidden-state indices (0: the
    embeddings, i: after layer i, -1: the final normed state), those states concatenated on the feature axis. The
    forward is asked with output_hidden_states=want_hidden, so transformers keeps only the states selected."""
    if not want_hidden:
        return None
    if want_hidden is True:
        return out.hidden_states[-1]
    return torch.cat([out.hidden_states[i] for i in want_hidden], dim=-1)


def tree_attention_mask(tree: TokenTree, past_len: int) -> torch.Tensor:
    """(1, 1, n, past_len + n) bool: every node sees the whole cache, its ancestors and itself."""
    n = len(tree)
    visible_past = torch.ones(n, past_len, dtype=torch.bool)
    return torch.cat([visible_past, tree.ancestor_mask()], dim=1)[None, None]


def verified_tree(model, tree: TokenTree) -> TokenTree:
    """What of `tree` the target verifies: all of it, or its first path for a target whose verify computes a tree's
    rows otherwise than its plain decoding but a chain's alike (`chains_only`: the onnxruntime backend's int8
    activations, OnnxRuntimeForward). The Decoder verifies this, and the machine's row check checks it."""
    if getattr(model, "chains_only", False) and not tree.is_chain:
        return tree.first_path()
    return tree


def verify_tree(model, cache, tree: TokenTree, want_hidden: bool | tuple[int, ...] = False,
                extra_embeds: torch.Tensor | None = None, extra_parents: torch.Tensor | None = None) -> VerifyOutput:
    """Run the target once over the tree; the cache grows by len(tree) (+ extra) entries, to be trimmed by commit_path.

    extra_embeds / extra_parents let a drafter attach non-vocabulary inputs (PPD's prompt tokens) to tree nodes: each
    extra input sits one level below its parent (a tree node or an earlier extra, by row index) and sees what that
    parent sees plus itself. Their rows follow the tree's rows.
    """
    device = model.device
    past_len = cache.get_seq_length()
    if extra_embeds is None:
        ids = tree.tokens.to(device)[None]
        if tree.is_chain:  # the causal mask is the tree mask: let the model build it (faster sdpa path)
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=want_hidden)
        else:
            out = model(input_ids=ids, attention_mask=tree_attention_mask(tree, past_len).to(device),
                        position_ids=tree.position_ids(past_len).to(device)[None], past_key_values=cache,
                        use_cache=True, output_hidden_states=want_hidden)
    else:
        out = _forward_with_extra(model, cache, tree, past_len, extra_embeds, extra_parents, want_hidden)
    hidden = selected_hidden(out, want_hidden)
    return VerifyOutput(logits=out.logits[0].float(), hidden=None if hidden is None else hidden[0])


def _forward_with_extra(model, cache, tree, past_len, extra_embeds, extra_parents, want_hidden):
    """The extras join the tree as extra rows: the joint TokenTree gives their depths and ancestor mask (and checks
    that each hangs under an earlier row); their placeholder tokens are never embedded."""
    placeholders = torch.zeros(extra_parents.numel(), dtype=torch.long)
    joint = TokenTree(torch.cat([tree.tokens, placeholders]), torch.cat([tree.parents, extra_parents.to(torch.long)]))
    embeds = model.get_input_embeddings()(tree.tokens.to(model.device))
    embeds = torch.cat([embeds, extra_embeds.to(embeds.dtype)], dim=0)[None]
    return model(inputs_embeds=embeds, attention_mask=tree_attention_mask(joint, past_len).to(model.device),
                 position_ids=joint.position_ids(past_len).to(model.device)[None], past_key_values=cache,
                 use_cache=True, output_hidden_states=want_hidden)
