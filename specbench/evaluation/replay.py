"""A drafter replayed against recorded answers: its steps under greedy exact acceptance, without the target.

Under greedy exact acceptance a lossless method emits the tokens of the target's plain decoding, and each step keeps
the longest tree path that spells the next of them, then the target's own token after it. A drafter that proposes from
the tokens alone (`Drafter.drafts_from_tokens`: no target outputs, nothing learnt from a step's verify) therefore drafts
the same trees whether the target runs or not, so a finished run's plain-decoding answers give its every step, its
tau and its own drafting time in seconds, where a decoding run costs minutes per setting: a sweep of its knobs
(`python run.py -m task=replay ...`) before the runs that time it. The step's wall time is the target's L(n), which is
not replayed. A drafter that learns across answers (suffix decoding's global tree) is replayed on a run's answers
in their order, as it met them (`replay_answers`); the evaluator replays a folder's answers the same way when it
resumes one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator

from specbench.data.prompts import Prompt, encode_conversation
from specbench.drafters.base import DecodeState, Drafter
from specbench.errors import SpecbenchError
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


def replay_answers(drafter: Drafter, records: Iterable[dict], prompts: dict[str, Prompt], tokenizer,
                   chat_template: bool, max_context: int | None = None) -> Iterator[tuple[dict, Replayed]]:
    """Each record's answer replayed in the records' order, after the prompt the evaluator asked it with: the
    conversation's turns so far with this method's own earlier answers. A turn whose earlier turn has no answer here
    (skipped: the evaluator stopped that conversation) is passed over."""
    answers: dict[str, list[str]] = {}
    for record in records:
        question, turn = str(record["question_id"]), int(record["turn"])
        prompt = prompts.get(question)
        if prompt is None:
            raise SpecbenchError(f"the records hold question_id {question!r}, which the dataset does not: give the "
                                 f"dataset the run answered")
        earlier = answers.setdefault(question, [])
        if len(earlier) != turn:
            continue
        ids = encode_conversation(tokenizer, prompt.turns[: turn + 1], earlier, chat_template)
        if len(ids) != record["prompt_len"]:
            raise SpecbenchError(f"the records' question {question} turn {turn} had a {record['prompt_len']}-token "
                                 f"prompt, this model's tokenizer encodes {len(ids)}: give the model (and its "
                                 f"chat_template) the run used")
        out = replay(drafter, ids, record["output_ids"], max_context)
        earlier.append(tokenizer.decode(record["output_ids"], skip_special_tokens=True))
        yield record, out
