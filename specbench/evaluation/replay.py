"""A drafter replayed against recorded answers: its steps under greedy exact acceptance, without the target.

Under greedy exact acceptance a lossless method emits the tokens of the target's plain decoding, and each step keeps
the longest tree path that spells the next of them, then the target's own token after it. A drafter that proposes from
the tokens alone (`Drafter.drafts_from_tokens`: no target outputs, nothing learnt from a step's verify) therefore drafts
the same trees whether the target runs or not, so a finished run's plain-decoding answers give its every step, its
tau and its own drafting time in seconds, where a decoding run costs minutes per setting: a sweep of its knobs
(`python run.py -m task=replay ...`) before the runs that time it. The step's wall time is the target's L(n), which is
not replayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specbench.drafters.base import DecodeState, Drafter
from specbench.trees.token_tree import TokenTree


@dataclass
class Replayed:
    """One answer replayed: accept_lengths[i] tokens emitted by step i (its accepted nodes + the target's token)."""

    accept_lengths: list[int]
    draft_s: float

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)


def replay(drafter: Drafter, prompt: list[int], answer: list[int], max_context: int | None = None) -> Replayed:
    """Decode `answer` (plain decoding's new tokens after `prompt`, EOS kept) as the decoder would with this drafter:
    its first token is the prefill's, every later one comes from a step. A tree that would not fit the context is the
    root alone, as Decoder._fit_context makes it."""
    tokens = list(answer)
    state = DecodeState(tokens=list(prompt) + tokens[:1], prompt_len=len(prompt))  # grown in place, as the decoder does
    drafter.reset(state)
    done, lengths, draft_s = 1, [], 0.0
    while done < len(tokens):
        t0 = time.perf_counter()
        tree = drafter.propose(state)
        draft_s += time.perf_counter() - t0
        if max_context is not None and len(state.tokens) - 1 + len(tree) + 1 > max_context:
            tree = TokenTree.chain(tree.tokens[0].item(), [])
        children: dict[tuple[int, int], int] = {}
        for node, (parent, token) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
            children.setdefault((parent, token), node)
        node, accepted = 0, 0
        while done + accepted < len(tokens) and (node, tokens[done + accepted]) in children:
            node, accepted = children[(node, tokens[done + accepted])], accepted + 1
        emitted = min(accepted + 1, len(tokens) - done)  # the last step of a cut answer emits what was kept
        state.tokens.extend(tokens[done: done + emitted])
        done += emitted
        lengths.append(emitted)
    return Replayed(lengths, draft_s)
