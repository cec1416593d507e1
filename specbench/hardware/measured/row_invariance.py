"""Whether a verify route computes each row of a multi-row call as plain decoding computes it, measured here.

Exact acceptance keeps a method's tokens equal to plain decoding's only if the verify gives every tree node the
logits its one-row forward gives along its path. Whether it does is a property of the machine's kernels as much as
of the code: a matmul of k rows may block its sums otherwise than one of a single row, and an activation quantised
to int8 turns a 1e-7 difference into a logit. So each execution is checked on the machine at hand, once, as the
decoder runs it (verify_tree then commit_path): chains of 2 to 16 rows and a branched tree, at a short and a longer
context, every row against plain decoding of its path one row at a time, and the result is kept in the machine
profile beside L(n).

A row that differs only by float rounding (the sums taken in another order) can flip a near-tie and nothing else;
where the route rounds its activations to int8 on the way, such a difference becomes tenths of a logit in some rows,
which the check sees as a difference beyond rounding. The verdict says which a route gives.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from specbench.execution.row_claims import BITWISE, DIFFERS, ROUNDING
from specbench.trees.token_tree import TokenTree
from specbench.verification import commit_path, new_cache, verified_tree, verify_tree

CONTEXTS = (30, 250)  # a short prompt and one past the first buckets and static shapes a backend pads to
CHAINS = (2, 3, 4, 8, 16)  # an odd count too: a kernel that runs rows in pairs runs a lone last row otherwise
# a branched tree of 8 nodes, 4 deep, as a drafter proposes (two children at the root and at a few nodes below)
TREE_PARENTS = (-1, 0, 0, 1, 1, 2, 3, 5)
# float rounding: a row's logits within this many units in the last place of the dtype, at the logits' own scale,
# of its one-row forward's; sums of a few thousand terms taken in another order stay well inside it, where an int8
# rounding of an activation moves a logit by tenths
ROUNDING_ULPS = 256


@dataclass(frozen=True)
class RowInvariance:
    """One execution's check: `max_abs_diff` of a verify row's logits from its one-row forward's over `rows` rows."""

    verdict: str  # BITWISE, ROUNDING (float rounding only) or DIFFERS (beyond it)
    max_abs_diff: float
    logit_scale: float  # the largest |logit| seen, the scale the rounding bound is taken at
    rows: int
    contexts: tuple[int, ...]

    @property
    def lossless(self) -> bool:
        """Exact acceptance on this route keeps plain decoding's tokens (up to float near-ties when ROUNDING)."""
        return self.verdict != DIFFERS

    def as_dict(self) -> dict:
        return asdict(self) | {"contexts": list(self.contexts)}

    @classmethod
    def from_dict(cls, data: dict) -> RowInvariance:
        return cls(str(data["verdict"]), float(data["max_abs_diff"]), float(data["logit_scale"]), int(data["rows"]),
                   tuple(int(c) for c in data["contexts"]))

    def describe(self) -> str:
        if self.verdict == BITWISE:
            return f"every row bitwise its one-row forward's ({self.rows} rows)"
        return (f"rows differ from their one-row forwards by up to {self.max_abs_diff:.2g} logits ({self.rows} rows, "
                f"logits up to {self.logit_scale:.3g})")


def verdict(max_abs_diff: float, logit_scale: float, dtype: torch.dtype) -> str:
    """BITWISE for no difference; ROUNDING when it is within ROUNDING_ULPS of the dtype at the logits' scale;
    DIFFERS otherwise."""
    if max_abs_diff == 0:
        return BITWISE
    bound = ROUNDING_ULPS * torch.finfo(dtype).eps * max(1.0, logit_scale)
    return ROUNDING if max_abs_diff <= bound else DIFFERS


@torch.inference_mode()
def check_rows(model, dtype: torch.dtype, vocab: int, contexts=CONTEXTS, chains=CHAINS,
               tree_parents=TREE_PARENTS, seed: int = 0) -> RowInvariance:
    """Run the check on `model` (a target as the run executes it: its backend, dtype and weights) with random
    tokens below `vocab`: every row of each chain and of the tree against plain decoding of its path; of the tree,
    what the Decoder verifies of it (verification.verified_tree)."""
    generator = torch.Generator().manual_seed(seed)
    worst, scale, rows = 0.0, 0.0, 0
    parents = torch.tensor(tree_parents)
    for context in contexts:
        prompt = torch.randint(vocab, (context,), generator=generator).tolist()
        tokens = torch.randint(vocab, (max([*chains, len(parents)]),), generator=generator)
        checks = [TokenTree.chain(int(tokens[0]), tokens[1:k].tolist()) for k in chains]
        checks.append(verified_tree(model, TokenTree(tokens[: len(parents)], parents)))
        cache = new_cache(model)  # the prompt, prefilled as the decoder prefills it (one call)
        model(input_ids=torch.tensor([prompt], device=model.device), past_key_values=cache, use_cache=True)
        plain = {}  # path of tokens -> its last row's logits under plain decoding
        for tree in checks:
            got = verify_tree(model, cache, tree).logits
            commit_path(cache, context, [])  # back to the prompt alone
            for node in sorted(range(len(tree)), key=lambda i: -int(tree.depths[i])):  # a deep path holds its prefixes
                path = tuple(tree.tokens[tree.path_to(node)].tolist())
                if path not in plain:
                    plain |= _plain_rows(model, cache, path)
                want = plain[path]
                worst = max(worst, float((got[node] - want).abs().max()))
                scale = max(scale, float(want.abs().max()))
                rows += 1
    return RowInvariance(verdict(worst, scale, dtype), worst, scale, rows, tuple(contexts))


def _plain_rows(model, cache, path: tuple[int, ...]) -> dict:
    """The logits plain decoding gives each prefix of `path` after the prompt in `cache` (one row a call, each
    committed as the decoder commits it); the cache is cropped back to the prompt after."""
    past, out = cache.get_seq_length(), {}
    for i, token in enumerate(path):
        logits = verify_tree(model, cache, TokenTree.chain(token, [])).logits[0]
        commit_path(cache, past + i, [0])
        out[path[: i + 1]] = logits
    commit_path(cache, past, [])
    return out
