"""The one decoding loop every method runs through: prefill, then draft -> verify -> accept -> commit -> observe.

Plain decoding is the same loop with a drafter that proposes nothing, so plain decoding and method timings
compare like with like (the same model calls, the same cache, the same bookkeeping).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbench.acceptance.base import AcceptanceRule
from specbench.sampling import SamplingParams
from specbench.drafters.base import DecodeState, Drafter, StepOutcome
from specbench.errors import SpecbenchError
from specbench.timing import StepTimer
from specbench.trees.token_tree import TokenTree
from specbench.verification import (VerifyOutput, cache_bytes, commit_path, new_cache, selected_hidden, verified_tree,
                                    verify_tree)


@dataclass
class StepRecord:
    tree_size: int  # rows verified in the forward, root included (PPD's prompt-token rows too)
    tree_depth: int  # deepest draft node (0 for the root alone)
    accepted: int  # draft tokens accepted (the bonus token excluded)
    draft_time: float  # propose + observe
    verify_time: float  # the target forward
    step_time: float  # the whole step, bookkeeping included
    tried_deeper: bool = True  # the last accepted node had children: one more depth was tried and failed


@dataclass
class Generation:
    prompt_len: int
    tokens: list[int]  # new tokens, the first one from prefill
    prefill_time: float
    wall_time: float  # prefill included
    steps: list[StepRecord] = field(default_factory=list)
    kv_peak_bytes: int = 0  # the target's and the drafter's caches at their largest (a tree just verified)
    token_logprobs: list[float] = field(default_factory=list)  # log p(token) under the sampling distribution (T > 0)

    @property
    def accept_lengths(self) -> list[int]:
        """Tokens gained per decode step, the bonus included (Spec-Bench's accept_lengths; 1 for every AR step)."""
        return [s.accepted + 1 for s in self.steps]


class Decoder:
    def __init__(self, model, drafter: Drafter, acceptance: AcceptanceRule, sampling: SamplingParams,
                 max_new_tokens: int, eos_token_ids: list[int] | tuple[int, ...] = (), seed: int = 0,
                 max_context: int | None = None) -> None:
        if max_new_tokens < 1:
            raise SpecbenchError(f"max_new_tokens={max_new_tokens} is invalid: it must be >= 1")
        self.model, self.drafter, self.acceptance, self.sampling = model, drafter, acceptance, sampling
        self.max_new_tokens, self.eos, self.seed = max_new_tokens, set(eos_token_ids), seed
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None) or 2**31
        self.timer = StepTimer(model.device)  # CUDA events and one sync per step on a GPU (see specbench.timing)

    def compile_ahead(self, shortest: int, longest: int) -> None:
        """Let the target and the drafter compile now what generations whose context runs from `shortest` to `longest`
        tokens would compile on the way (OpenVinoForward.compile_ahead: a static model per cache capacity), so none is
        timed."""
        ahead = getattr(self.model, "compile_ahead", None)
        if ahead is not None:
            ahead(shortest, longest)
        self.drafter.compile_ahead(shortest, longest)

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if len(prompt_ids) == 0:
            raise SpecbenchError("the prompt is empty: it must hold at least one token")
        if len(prompt_ids) >= self.max_context:
            raise SpecbenchError(f"the prompt has {len(prompt_ids)} tokens, more than the model's context of "
                                 f"{self.max_context} allows; shorten it or pick a model with a longer context")

    def generate(self, prompt_ids: list[int]) -> Generation:
        """The answer to `prompt_ids`, with torch at the thread count the target's forward asks for around it
        (`torch_threads`: OnnxRuntimeForward's one), the process's own restored after."""
        threads = getattr(self.model, "torch_threads", None)
        if threads is None:
            return self._generate(prompt_ids)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return self._generate(prompt_ids)
        finally:
            torch.set_num_threads(before)

    @torch.inference_mode()
    def _generate(self, prompt_ids: list[int]) -> Generation:
        self._check_prompt(prompt_ids)
        prompt_len = len(prompt_ids)
        generator = torch.Generator().manual_seed(self.seed)
        cache = new_cache(self.model)
        want_hidden = self.drafter.needs_hidden_states

        timer = self.timer
        start = timer.mark()
        prompt = TokenTree.chain(prompt_ids[0], prompt_ids[1:])
        extras = self._prefill_extras(self.drafter, prompt)
        if extras is None or len(extras[1]) == 0:
            # the last row's logits only, as the engines project a prompt: every row's would add a projection of the
            # whole prompt onto the vocabulary, which nothing reads (experiments/openvino_engine_speed). A drafter
            # whose extras are empty (EAGLE) observes the prefill for the features at every prompt row, not logits.
            out = self.model(input_ids=torch.tensor([prompt_ids], device=self.model.device), past_key_values=cache,
                             use_cache=True, output_hidden_states=want_hidden, logits_to_keep=1)
            hidden = selected_hidden(out, want_hidden)
            pout = VerifyOutput(out.logits[0, -1:].float(), None if hidden is None else hidden[0])
            last = VerifyOutput(pout.logits, None if hidden is None else pout.hidden[-1:])
        else:  # the prompt and the drafter's extras in one forward; only the prompt's entries stay in the cache
            pout = verify_tree(self.model, cache, prompt, want_hidden, *extras)
            commit_path(cache, 0, list(range(prompt_len)))
            last = output_row(pout, prompt_len - 1)
        first = self.sampling.sample(last.logits[0], generator)
        state = DecodeState(tokens=list(prompt_ids) + [first], prompt_len=prompt_len, last=last)
        self.drafter.reset(state)
        if extras is not None:
            self.drafter.observe(StepOutcome(prompt, list(range(prompt_len)), first, pout))
        prefilled = timer.mark()
        timer.sync()
        gen = Generation(prompt_len, [first], prefill_time=timer.seconds(start, prefilled), wall_time=0.0)
        self._log_probs(gen, last.logits, [first])

        done = self._finished(gen, [first])
        while not done:
            t0 = timer.mark()
            tree = verified_tree(self.model, self._fit_context(self.drafter.propose(state), cache.get_seq_length()))
            t1 = timer.mark()
            past_len = cache.get_seq_length()
            extras = self.drafter.verify_extras(tree)
            vout = verify_tree(self.model, cache, tree, want_hidden, *(extras or (None, None)))
            t2 = timer.mark()
            rows = len(tree) + (0 if extras is None else len(extras[1]))
            if rows > 1:  # a one-row step keeps its row, so the caches' peak after it is the end's (taken below)
                gen.kv_peak_bytes = max(gen.kv_peak_bytes, cache_bytes(cache) + self.drafter.cache_bytes())
            acc = self.acceptance.accept(tree, vout.logits[: len(tree)], self.sampling, generator)
            commit_path(cache, past_len, acc.path)
            drafted = tree.tokens.tolist()
            new_tokens = [drafted[node] for node in acc.path[1:]] + [acc.next_token]
            state.tokens.extend(new_tokens)
            state.last = path_rows(vout, acc.path)
            t3 = timer.mark()
            self.drafter.observe(StepOutcome(tree, acc.path, acc.next_token, vout))
            t4 = timer.mark()
            timer.sync()
            gen.tokens.extend(new_tokens)
            self._log_probs(gen, state.last.logits, new_tokens)
            gen.steps.append(StepRecord(rows, tree.depth(), acc.accepted,
                                        draft_time=timer.seconds(t0, t1) + timer.seconds(t3, t4),
                                        verify_time=timer.seconds(t1, t2), step_time=timer.seconds(t0, t4),
                                        tried_deeper=tree.has_children(acc.path[-1])))
            done = self._finished(gen, new_tokens)

        gen.tokens = self._truncate(gen.tokens)
        gen.token_logprobs = gen.token_logprobs[: len(gen.tokens)]
        end = timer.mark()
        timer.sync()
        gen.wall_time = timer.seconds(start, end)
        # the caches at the end: the peak of one-row steps, and of a prompt answered by prefill alone
        gen.kv_peak_bytes = max(gen.kv_peak_bytes, cache_bytes(cache) + self.drafter.cache_bytes())
        return gen

    def _log_probs(self, gen: Generation, logits: torch.Tensor, tokens: list[int]) -> None:
        """Under sampling, record how likely the target found each emitted token: the evaluator's distribution check
        compares these between plain decoding and method (row i of logits predicted tokens[i])."""
        if not self.sampling.greedy:
            probs = self.sampling.probs(logits[: len(tokens)])
            gen.token_logprobs += probs.gather(-1, torch.tensor(tokens)[:, None]).log().flatten().tolist()

    def _finished(self, gen: Generation, new_tokens: list[int]) -> bool:
        return (len(gen.tokens) >= self.max_new_tokens or not self.eos.isdisjoint(new_tokens)
                or gen.prompt_len + len(gen.tokens) >= self.max_context)

    def _truncate(self, tokens: list[int]) -> list[int]:
        """Cut at the first EOS (kept) and at max_new_tokens: exactly where plain decoding would have stopped."""
        for i, t in enumerate(tokens):
            if t in self.eos:
                tokens = tokens[: i + 1]
                break
        return tokens[: self.max_new_tokens]

    def _prefill_extras(self, drafter: Drafter, prompt: TokenTree) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The drafter's prefill extras, unless they would reach past the context (then a plain prefill)."""
        extras = drafter.prefill_extras(prompt)
        if extras is None or len(prompt) + len(extras[1]) >= self.max_context:
            return None
        return extras

    def _fit_context(self, tree: TokenTree, past_len: int) -> TokenTree:
        """Near the end of the context there is no room for a tree: verify the root alone."""
        if past_len + len(tree) + 1 > self.max_context:
            return TokenTree.chain(tree.tokens[0].item(), [])
        return tree


def path_rows(out: VerifyOutput, path: list[int]) -> VerifyOutput:
    """A forward's outputs at an accepted path's rows, as state.last holds them: a chain's path is its first rows,
    taken as a view, where indexing by the list would copy a vocabulary-wide row per node every step, a share of a
    small model's step (experiments/onnxruntime_verify)."""
    rows = slice(0, len(path)) if path == list(range(len(path))) else path
    return VerifyOutput(out.logits[rows], None if out.hidden is None else out.hidden[rows])


def output_row(out: VerifyOutput, row: int) -> VerifyOutput:
    """One row of a forward's outputs, as state.last holds them."""
    return VerifyOutput(out.logits[row: row + 1], None if out.hidden is None else out.hidden[row: row + 1])
