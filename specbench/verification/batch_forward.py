"""Batched verification: b sequences' trees in one target forward over one DynamicCache, and per-sequence commits.

Cache layout: batch row i holds sequence i's committed entries in the left-aligned slots [0, committed[i]); the slots
from committed[i] up to the cache length are stale (prompt padding, rejected tree rows, other sequences being longer)
and every mask hides them. A step appends N rows per sequence at slots [L, L + N) (its tree, the extra rows a drafter
attached, then padding up to the batch's largest); commit_batch moves each sequence's accepted rows down to
[committed[i], committed[i] + len(path)) and crops the cache to the longest sequence, so the cache stays as long as
the longest committed sequence rather than growing by every step's padding.

Stale slots only ever hold finite values (no row's mask is empty), so the zero attention weight a mask gives them
stays exactly zero: a NaN there would leak into every row through 0 * NaN.
"""

from __future__ import annotations

import torch

from specbench.trees.token_tree import TokenTree
from specbench.verification.tree_forward import VerifyOutput, selected_hidden


@torch.inference_mode()
def prefill_batch(model, cache, prompts: list[list[int]], want_hidden: bool | tuple[int, ...] = False
                  ) -> list[VerifyOutput]:
    """Prefill prompts of different lengths, right-padded, in one forward; the outputs at each prompt's last token.

    With right padding the model's own causal mask is already correct for every real token (padding only ever comes
    after it), so no padding mask is passed; the padded slots hold finite junk that later masks hide.
    """
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    out = model(input_ids=ids.to(model.device), past_key_values=cache, use_cache=True,
                output_hidden_states=want_hidden)
    hidden = selected_hidden(out, want_hidden)
    return [VerifyOutput(out.logits[i, n - 1: n].float(), None if hidden is None else hidden[i, n - 1: n])
            for i, n in enumerate(lengths)]


def _joint_tree(tree: TokenTree, extras: tuple[torch.Tensor, torch.Tensor] | None) -> TokenTree:
    """The tree plus a drafter's extra rows (PPD's prompt tokens) after it, as verify_tree's extras path joins them:
    the joint tree gives their depths and ancestor mask; their placeholder tokens are never embedded."""
    if extras is None:
        return tree
    parents = extras[1].to(torch.long)
    return TokenTree(torch.cat([tree.tokens, torch.zeros(parents.numel(), dtype=torch.long)]),
                     torch.cat([tree.parents, parents]))


def batch_tree_mask(joints: list[TokenTree], committed: list[int], past_len: int,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(b, 1, N, past_len + N) bool mask and (b, N) position ids, on device, for per-sequence trees padded to N rows.

    Row r of sequence i sees that sequence's committed slots, its ancestors and itself, at position committed[i] +
    depth. A padding row sees only itself (an empty row would give NaN, see the module docstring) and is never read.
    The (b, N, past_len) cache part is built on the device: it is the large one.
    """
    b, width = len(joints), max(len(j) for j in joints)
    block = torch.eye(width, dtype=torch.bool).repeat(b, 1, 1)
    positions = torch.tensor(committed)[:, None].repeat(1, width)
    for i, joint in enumerate(joints):
        n = len(joint)
        block[i, :n, :n] = joint.ancestor_mask()
        positions[i, :n] = joint.position_ids(committed[i])
    past = torch.arange(past_len, device=device)[None, :] < torch.tensor(committed, device=device)[:, None]
    mask = torch.cat([past[:, None, :].expand(b, width, past_len), block.to(device)], dim=2)
    return mask[:, None], positions.to(device)


@torch.inference_mode()
def verify_batch(model, cache, trees: list[TokenTree], committed: list[int],
                 want_hidden: bool | tuple[int, ...] = False,
                 extras: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None) -> list[VerifyOutput]:
    """One target forward over every sequence's tree (+ extras); the cache grows by N rows per sequence, to be
    trimmed by commit_batch. Returns, per sequence, the rows verify_tree would return (tree rows, then extras).

    The forward always takes inputs_embeds, built with the model's own embedding layer (the vectors input_ids would
    give), so that extra rows, which are embeddings and not tokens, need no second code path.
    """
    extras = extras if extras is not None else [None] * len(trees)
    joints = [_joint_tree(t, e) for t, e in zip(trees, extras)]
    past_len = cache.get_seq_length()
    mask, positions = batch_tree_mask(joints, committed, past_len, model.device)
    width = mask.shape[2]
    tokens = torch.stack([torch.cat([j.tokens, j.tokens[:1].repeat(width - len(j))]) for j in joints])
    embeds = model.get_input_embeddings()(tokens.to(model.device))
    for i, (tree, extra) in enumerate(zip(trees, extras)):
        if extra is not None:
            embeds[i, len(tree): len(joints[i])] = extra[0].to(embeds.dtype)
    out = model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, past_key_values=cache,
                use_cache=True, output_hidden_states=want_hidden)
    hidden = selected_hidden(out, want_hidden)
    return [VerifyOutput(out.logits[i, : len(j)].float(), None if hidden is None else hidden[i, : len(j)])
            for i, j in enumerate(joints)]


def commit_batch(cache, committed: list[int], past_len: int, paths: list[list[int]]) -> list[int]:
    """Move each sequence's accepted rows (path: row indices of its tree, root first) from the step's slots past_len +
    path to its slots committed[i] + 0..len(path), then crop the cache to the longest sequence. Returns the new
    committed lengths.

    transformers has no per-row gather or scatter for caches, so each layer's keys and values are rewritten here
    (a DynamicCache of full-attention layers, as the decoders build it). Only the accepted rows move, not the cache.
    """
    width = max(len(p) for p in paths)
    src = torch.tensor([[past_len + r for r in p + p[-1:] * (width - len(p))] for p in paths])
    # a padded entry lands at a slot past its sequence's new length: stale, hidden by every later mask
    dst = torch.tensor(committed)[:, None] + torch.arange(width)[None]
    on_device = {}  # the layers may sit on several devices (device_map): move the indices once per device
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        device = layer.keys.device
        if device not in on_device:
            on_device[device] = (src.to(device)[:, None, :, None], dst.to(device)[:, None, :, None])
        shape = (*layer.keys.shape[:2], width, layer.keys.shape[-1])
        s, d = (index.expand(shape) for index in on_device[device])
        for name in ("keys", "values"):
            t = getattr(layer, name)
            t.scatter_(2, d, t.gather(2, s))  # gather first: every source row is read before any slot is written
    new = [c + len(p) for c, p in zip(committed, paths)]
    drop = cache.get_seq_length() - max(new)
    if drop:
        cache.crop(-drop)
    return new


def keep_sequences(cache, rows: list[int], committed: list[int]) -> None:
    """Keep only the given batch rows (sequences still decoding) and crop to the longest of them; committed: every
    row's committed length, before the selection."""
    device = cache.layers[0].keys.device
    cache.batch_select_indices(torch.tensor(rows, dtype=torch.long, device=device))
    drop = cache.get_seq_length() - max(committed[r] for r in rows)
    if drop:
        cache.crop(-drop)
