"""Batched speculative decoding for any method: b prompts decoded together, one target forward per step.

Every step each live sequence drafts on its own (its own drafter state, a loop), then one forward verifies all the
trees (specbench.verification.batch_forward), and each sequence accepts, commits and stops on its own. A sequence
runs exactly the single-sequence loop of specbench.decoding.Decoder: the same drafter calls in the same order, its
own torch.Generator seeded like Decoder's, the same truncation, so its tokens equal Decoder.generate's (greedy, and
under sampling when its drafter is deterministic); only the target's numerics differ (padded batch shapes).

A finished sequence leaves the batch: its cache row is sliced out, so later forwards cost what the live sequences
need (masking it would keep paying for its rows and its cache until the last sequence ends).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specbench.decoding import Decoder, Generation, StepRecord, output_row, path_rows
from specbench.drafters.base import DecodeState, Drafter, StepOutcome
from specbench.errors import SpecbenchError
from specbench.trees.policy import TreePolicy
from specbench.trees.token_tree import TokenTree
from specbench.verification import cache_bytes, commit_batch, keep_sequences, prefill_batch, verify_batch


def validate_batch_size(batch_size) -> int:
    """eval.batch_size: prompts decoded together (1 decodes them one at a time)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise SpecbenchError(f"eval.batch_size={batch_size!r} is invalid: it must be an integer >= 1 (the number of "
                             f"prompts decoded together; 1 decodes one at a time)")
    return batch_size


def fork_drafter(drafter: Drafter) -> Drafter:
    """A drafter for one sequence of a batch: it shares the weights and read-only indexes (Medusa heads, PPD prompt
    tokens, a draft model, an SSSD datastore) and, once reset(), owns its per-generation state.

    A shallow copy suffices for the drafters' own state because every drafter's reset()/propose() rebinds it (the
    SSSD input index, the draft model's cache and generator, Medusa's and PPD's guesses) rather than mutating a shared
    object. A tree policy may keep per-generation state as well (LLMCad's adaptive alpha) and the shallow copy would
    share it, so the drafter's tree policies are copied one level too (static tables inside stay shared).
    """
    fork = copy.copy(drafter)
    for name, value in vars(drafter).items():
        if isinstance(value, TreePolicy):
            setattr(fork, name, copy.copy(value))
    return fork


@dataclass
class BatchStep:
    batch_size: int  # live sequences verified by this forward
    rows: int  # rows per sequence in the forward (the largest tree + extras this step; the others are padded)
    cache_len: int  # cache slots per sequence before the forward (the longest live sequence)
    tokens: int  # tokens all sequences gained this step, bonus tokens included (before EOS / max_new truncation)
    draft_time: float  # every sequence's propose + observe
    verify_time: float  # the one batched target forward
    step_time: float


@dataclass
class BatchRun:
    """What one generate_batch call cost as a batch, for throughput (the per-prompt records are the Generations)."""

    batch_size: int
    prefill_time: float
    wall_time: float  # until the last sequence finished
    steps: list[BatchStep] = field(default_factory=list)
    kv_peak_bytes: int = 0  # the target's batch cache plus every drafter's, at their largest

    @property
    def tokens(self) -> int:
        """Tokens the batch produced in all, prefill tokens included (before truncation)."""
        return self.batch_size + sum(s.tokens for s in self.steps)


class BatchDecoder(Decoder):
    """Decoder's loop for b sequences at once; constructed like Decoder. generate_batch fills last_run."""

    last_run: BatchRun | None = None

    @torch.inference_mode()
    def generate_batch(self, prompts: list[list[int]]) -> list[Generation]:
        """One Generation per prompt, in order. Per sequence: steps and tokens as Decoder records them, draft_time
        its own propose + observe, verify_time and step_time the batch's (the sequence waited that long),
        prefill_time the batched prefill's, wall_time until that sequence finished, kv_peak_bytes its share of the
        batch cache (its row, padding included) plus its drafter's."""
        for prompt in prompts:
            self._check_prompt(prompt)
        if not prompts:
            return []
        b, want_hidden = len(prompts), self.drafter.needs_hidden_states
        drafters = [fork_drafter(self.drafter) for _ in prompts]
        generators = [torch.Generator().manual_seed(self.seed) for _ in prompts]
        cache = DynamicCache()

        timer = self.timer
        start = timer.mark()
        chains = [TokenTree.chain(p[0], p[1:]) for p in prompts]
        prefill_extras = [self._prefill_extras(d, c) for d, c in zip(drafters, chains)]
        if all(e is None for e in prefill_extras):
            lasts, pouts = prefill_batch(self.model, cache, prompts, want_hidden), None
        else:  # Decoder.generate's prefill with extras, batched: a step on an empty cache that commits the prompts
            pouts = verify_batch(self.model, cache, chains, [0] * b, want_hidden, prefill_extras)
            commit_batch(cache, [0] * b, 0, [list(range(len(p))) for p in prompts])
            lasts = [output_row(out, len(p) - 1) for out, p in zip(pouts, prompts)]
        states = []
        for k, (prompt, last, drafter, generator) in enumerate(zip(prompts, lasts, drafters, generators)):
            first = self.sampling.sample(last.logits[0], generator)
            states.append(DecodeState(tokens=list(prompt) + [first], prompt_len=len(prompt), last=last))
            drafter.reset(states[-1])
            if prefill_extras[k] is not None:
                drafter.observe(StepOutcome(chains[k], list(range(len(prompt))), first, pouts[k]))
        prefilled = timer.mark()
        timer.sync()
        prefill_time = timer.seconds(start, prefilled)
        run = self.last_run = BatchRun(b, prefill_time, 0.0, kv_peak_bytes=cache_bytes(cache))
        gens = [Generation(len(p), [s.tokens[-1]], prefill_time=prefill_time, wall_time=0.0) for p, s in
                zip(prompts, states)]
        for gen, last in zip(gens, lasts):
            self._log_probs(gen, last.logits, gen.tokens)
            gen.kv_peak_bytes = cache_bytes(cache) // b  # a prompt answered by prefill alone
        committed = [len(p) for p in prompts]  # per sequence: cache slots holding its tokens (all but the root)
        live = list(range(b))  # sequence ids, in cache-row order
        finished = {}  # sequence id: the mark of the step that ended it, read once the loop's last sync has passed
        live = self._retire(cache, live, committed, gens, [[g.tokens[0]] for g in gens], finished)

        while live:
            t0 = timer.mark()
            trees, extras, drafting = [], [], []  # drafting: each sequence's propose and observe marks
            for i in live:
                a = timer.mark()
                trees.append(self._fit_context(drafters[i].propose(states[i]), committed[i]))
                drafting.append([a, timer.mark()])
                extras.append(drafters[i].verify_extras(trees[-1]))
            t1 = timer.mark()
            past_len = cache.get_seq_length()
            vouts = verify_batch(self.model, cache, trees, [committed[i] for i in live], want_hidden, extras)
            t2 = timer.mark()
            rows = cache.get_seq_length() - past_len
            total = cache_bytes(cache)
            share = total // len(live)
            run.kv_peak_bytes = max(run.kv_peak_bytes, total + sum(drafters[i].cache_bytes() for i in live))
            accs = [self.acceptance.accept(tree, vout.logits[: len(tree)], self.sampling, generators[i])
                    for i, tree, vout in zip(live, trees, vouts)]
            new = commit_batch(cache, [committed[i] for i in live], past_len, [acc.path for acc in accs])
            new_tokens = []
            for i, n, tree, vout, acc in zip(live, new, trees, vouts, accs):
                committed[i] = n
                new_tokens.append(tree.tokens[acc.path[1:]].tolist() + [acc.next_token])
                states[i].tokens.extend(new_tokens[-1])
                states[i].last = path_rows(vout, acc.path)
            for k, (i, tree, vout, acc) in enumerate(zip(live, trees, vouts, accs)):
                drafting[k].append(timer.mark())
                drafters[i].observe(StepOutcome(tree, acc.path, acc.next_token, vout))
                drafting[k].append(timer.mark())
            t4 = timer.mark()
            timer.sync()
            draft_times = [timer.seconds(a, b) + timer.seconds(c, d) for a, b, c, d in drafting]
            for k, (i, tree, vout, acc) in enumerate(zip(live, trees, vouts, accs)):
                gen = gens[i]
                gen.tokens.extend(new_tokens[k])
                self._log_probs(gen, states[i].last.logits, new_tokens[k])
                gen.kv_peak_bytes = max(gen.kv_peak_bytes, share + drafters[i].cache_bytes())
                rows_i = len(tree) + (0 if extras[k] is None else len(extras[k][1]))
                gen.steps.append(StepRecord(rows_i, tree.depth(), acc.accepted, draft_time=draft_times[k],
                                            verify_time=timer.seconds(t1, t2), step_time=timer.seconds(t0, t4),
                                            tried_deeper=tree.has_children(acc.path[-1])))
            run.steps.append(BatchStep(len(live), rows, past_len, sum(map(len, new_tokens)), sum(draft_times),
                                       verify_time=timer.seconds(t1, t2), step_time=timer.seconds(t0, t4)))
            live = self._retire(cache, live, committed, gens, new_tokens, finished)

        end = timer.mark()
        timer.sync()
        run.wall_time = timer.seconds(start, end)
        for i, mark in finished.items():
            gens[i].wall_time = timer.seconds(start, mark)
        return gens

    def _retire(self, cache, live: list[int], committed: list[int], gens: list[Generation],
                new_tokens: list[list[int]], finished: dict) -> list[int]:
        """Finish the sequences whose step ended them (new_tokens: each live sequence's, in order) and slice them out
        of the cache; returns the sequences still decoding. finished[i] gets a mark of when sequence i ended: its
        wall time, read after the loop so that a sequence ending costs no synchronisation of its own."""
        still = [k for k, (i, tokens) in enumerate(zip(live, new_tokens)) if not self._finished(gens[i], tokens)]
        if len(still) == len(live):
            return live
        now = self.timer.mark()
        for k, i in enumerate(live):
            if k not in still:
                gen = gens[i]
                gen.tokens = self._truncate(gen.tokens)
                gen.token_logprobs = gen.token_logprobs[: len(gen.tokens)]
                finished[i] = now
        if still:
            keep_sequences(cache, still, [committed[i] for i in live])
        return [live[k] for k in still]

