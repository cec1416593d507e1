"""The Evaluator decodes every prompt with plain decoding and each method back to back, in one process
and dtype, so a method's time on a prompt is compared with plain decoding's on the same prompt under the same machine
load. It appends one record per prompt, turn and method, and the records become the run's summary, plots and logs.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from specbench.acceptance.base import AcceptanceRule
from specbench.acceptance.exact import ExactAcceptance
from specbench.batching import BatchDecoder, validate_batch_size
from specbench.data.prompts import Prompt, PromptDataset, encode_conversation
from specbench.decoding import Decoder, Generation
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.base import Drafter
from specbench.engines.base import Engine
from specbench.errors import SpecbenchError
from specbench.evaluation.memory import peak_allocated_bytes
from specbench.evaluation.metrics import decoded
from specbench.evaluation.replay import replay_answers
from specbench.evaluation.run_folder import RECORDS_FILE, RecordStore, backbone_reference
from specbench.files import write_atomic
from specbench.models.loading import LoadedModel
from specbench.names import PLAIN
from specbench.sampling import SamplingParams


@dataclass
class EvalSettings:
    max_new_tokens: int = 128
    seed: int = 0
    warmup: int = 1
    chat_template: bool = True
    plain: bool = True  # run plain decoding on the same prompts (needed for speedup and lossless match)
    first_turn_only: bool = False  # multi-turn prompts (MT-Bench): decode turn 1 only
    memory_probe: bool = True  # measure each method's peak allocation once, on a short untimed generation
    batch_size: int = 1  # prompts decoded together, verified in one forward per step (batching.BatchDecoder)

    def __post_init__(self) -> None:
        for key, low in (("max_new_tokens", 1), ("warmup", 0)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise SpecbenchError(f"eval.{key}={value!r} is invalid: it must be an integer >= {low}")
        validate_batch_size(self.batch_size)


@dataclass
class MethodRun:
    label: str  # the method's name in records and summaries
    drafter: Drafter
    acceptance: AcceptanceRule
    settings_hash: str = ""
    method_name: str = ""  # the method config behind the label
    target: LoadedModel | None = None  # None: the run's target; plain decoding in another dtype brings its own copy
    reference: str | None = None  # the label of its lossless reference, when not the plain decoding of the target
    engine: Engine | None = None  # an engine row (evaluation/engines.py): it decodes the prompts itself


def load_1min() -> float | None:
    """The machine's 1-minute load average as a prompt's answer is recorded: other work sharing the CPU shows in it
    (metrics.busy_note); None where the OS keeps none."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


class Evaluator:
    def __init__(self, target: LoadedModel, runs: list[MethodRun], sampling: SamplingParams, dataset: PromptDataset,
                 settings: EvalSettings, run_dir: str | Path, provenance: dict | None = None,
                 plain_hash: str = "") -> None:
        self.target, self.sampling, self.dataset, self.settings = target, sampling, dataset, settings
        self.provenance = provenance or {}
        if settings.plain and PLAIN not in {r.label for r in runs}:
            # plain decoding samples from the target itself: a lossy rule (typical's greedy root) must not leak in
            runs = [MethodRun(PLAIN, PlainDrafter(), ExactAcceptance(), plain_hash, PLAIN), *runs]
        self.runs = self._with_backbones(runs)
        self.run_dir = Path(run_dir)
        self.store = RecordStore(self.run_dir / RECORDS_FILE)
        self.memory_path = self.run_dir / "memory.json"

    @staticmethod
    def _with_backbones(runs: list[MethodRun]) -> list[MethodRun]:
        """A drafter that brings the backbone it verifies with (a Medusa-2 artifact's tuned one) decodes on it, and
        plain decoding of that backbone, run just before it, is its lossless reference."""
        out = []
        for run in runs:
            backbone = run.drafter.verifier
            if backbone is not None:
                run.target, run.reference = backbone, backbone_reference(run.label)
                out.append(MethodRun(run.reference, PlainDrafter(), ExactAcceptance(), run.settings_hash,
                                     run.method_name, backbone))
            out.append(run)
        return out

    def _decoder(self, run: MethodRun) -> Decoder | Engine:
        if run.engine is not None:
            return run.engine
        cls = Decoder if self.settings.batch_size == 1 else BatchDecoder
        return cls((run.target or self.target).model, run.drafter, run.acceptance, self.sampling, self.settings.max_new_tokens,
                       self.target.eos_token_ids, seed=self.settings.seed, max_context=self.target.max_context)

    def _turns(self, prompt: Prompt) -> int:
        return 1 if self.settings.first_turn_only else len(prompt.turns)

    def run(self) -> pd.DataFrame:
        """Decode every (prompt, turn, method) not yet in records.jsonl; return the records of the whole folder."""
        decoders = [(run, self._decoder(run)) for run in self.runs]
        todo = [p for p in self.dataset
                if any(not self.store.has(r.label, p.question_id, t) for r in self.runs for t in range(self._turns(p)))]
        if todo:
            first = self._ids(todo[0], [])
            if len(first) < self.target.max_context - 1:
                self._warmup(decoders, first)
                self._compile_ahead(decoders, todo)
                self._probe_memory(decoders, first)
            self._relearn()
        b = self.settings.batch_size
        chunks = [todo[i: i + b] for i in range(0, len(todo), b)]
        bar = tqdm(total=len(todo), desc=f"{len(self.runs)} methods on {self.dataset.name}", unit="prompt",
                   dynamic_ncols=True)
        for i, chunk in enumerate(chunks):
            # interleaved, so every method meets the same machine state per prompt, and the first place rotates: the
            # method that goes first pays what the others then find ready (a dynamic-shape model prepared for this
            # prompt's length, as the w4a8r prefill's), which would always be plain decoding
            for run, decoder in decoders[i % len(decoders):] + decoders[: i % len(decoders)]:
                self._conversations(run, decoder, chunk)
            bar.update(len(chunk))
            bar.set_postfix_str(self._postfix())
        bar.close()
        return self.store.frame()

    def _ids(self, prompt: Prompt, answers: list[str]) -> list[int]:
        turns = prompt.turns[: len(answers) + 1]
        return encode_conversation(self.target.tokenizer, turns, answers, self.settings.chat_template)

    def _conversations(self, run: MethodRun, decoder: Decoder, prompts: list[Prompt]) -> None:
        """Turn k of every prompt is asked after this method's own answers to the earlier turns (Spec-Bench's
        multi-turn MT-Bench). With a BatchDecoder the prompts' turn k is decoded in one batch, and every record also
        holds the batch's id and wall time, from which the summary computes throughput."""
        answers: dict[str, list[str] | None] = {p.question_id: [] for p in prompts}  # None: a turn was skipped
        for turn in range(max(self._turns(p) for p in prompts)):
            pending = []
            for prompt in prompts:
                if turn >= self._turns(prompt) or answers[prompt.question_id] is None:
                    continue
                done = self.store.get(run.label, prompt.question_id, turn)
                if done is None:
                    ids = self._ids(prompt, answers[prompt.question_id])
                    if len(ids) >= self.target.max_context - 1:  # no room to answer: counted, not fatal
                        done = self._append(run, prompt, turn, {"skipped": True, "prompt_len": len(ids)})
                    else:
                        pending.append((prompt, ids))
                        continue
                self._answer(answers, prompt, done)
            if not pending:
                continue
            if isinstance(decoder, BatchDecoder):
                gens = decoder.generate_batch([ids for _, ids in pending])
                batch = {"batch_size": len(pending), "batch_id": uuid.uuid4().hex[:12],
                         "batch_wall_time": decoder.last_run.wall_time}
            else:
                gens, batch = [decoder.generate(ids) for _, ids in pending], {}
            for (prompt, _), gen in zip(pending, gens):
                self._answer(answers, prompt, self._append(run, prompt, turn, self._fields(run, gen) | batch))

    def _answer(self, answers: dict, prompt: Prompt, record: dict) -> None:
        """A later turn would need a skipped turn's answer: the conversation stops there."""
        if record.get("skipped"):
            answers[prompt.question_id] = None
        else:
            answers[prompt.question_id].append(
                self.target.tokenizer.decode(record["output_ids"], skip_special_tokens=True))

    def _append(self, run: MethodRun, prompt: Prompt, turn: int, fields: dict) -> dict:
        record = {"method": run.label, "method_name": run.method_name, "question_id": prompt.question_id,
                  "turn": turn, "category": prompt.category, **fields, "settings_hash": run.settings_hash,
                  **self.provenance, "load_1min": load_1min()}
        if run.target is not None:
            record["dtype"] = str(run.target.model.dtype).removeprefix("torch.")
            record["backend"] = run.target.backend
            record["weights"] = run.target.weights
            record["model"] = run.target.name  # a tuned backbone names itself: <model>+medusa2:<checkpoint>
        if run.reference is not None:
            record["reference"] = run.reference
        if run.engine is not None and not fields.get("skipped"):  # the row names what it ran: version, weights, threads
            about = run.engine.describe()
            record |= {"engine": run.engine.name, "engine_mode": run.engine.mode, "engine_version": about["version"],
                       "backend": run.engine.name, "weights": about["weights"], "threads": about["threads"],
                       "dtype": about.get("dtype"), "lossless_rule": False}
        self.store.append(record)
        return record

    def _warmup(self, decoders, ids: list[int]) -> None:
        """Untimed generations first, so one-time costs (allocator, kernels, caches) do not land on the first prompt."""
        for _ in range(self.settings.warmup):
            for _, decoder in decoders:
                self._short(decoder, ids)

    def _compile_ahead(self, decoders, todo: list[Prompt]) -> None:
        """After the warm-up, whatever each target compiles per context size is compiled for the longest context the
        run can reach (every turn's question and a full answer to each), so no prompt's time holds a compile."""
        shortest = min(len(self._ids(p, [])) for p in todo)
        longest = max(len(self._ids(p, [""] * (self._turns(p) - 1))) + self._turns(p) * self.settings.max_new_tokens
                      for p in todo)
        for _, decoder in decoders:
            if isinstance(decoder, Decoder):
                decoder.compile_ahead(shortest, longest)

    def _relearn(self) -> None:
        """A drafter that learns across answers forgets the untimed generations (the first prompt's answer, which it
        would otherwise know before answering it) and learns this folder's answers so far in their order: a resumed
        run drafts as the unbroken one would have, and task=replay gives its every step."""
        prompts = {p.question_id: p for p in self.dataset}
        for run in self.runs:
            if run.engine is not None or not run.drafter.learns_across_answers:
                continue
            run.drafter.forget()
            done = [r for r in self.store.rows if r["method"] == run.label and not r.get("skipped")
                    and r["question_id"] in prompts]
            for _ in replay_answers(run.drafter, done, prompts, self.target.tokenizer, self.settings.chat_template,
                                    self.target.max_context):
                pass

    def _probe_memory(self, decoders, ids: list[int]) -> None:
        """Each method's peak allocation during a short generation (KV caches and activations; weights apart)."""
        if not self.settings.memory_probe:
            return
        known = self.memory()
        for run, decoder in decoders:
            if run.label not in known and run.engine is None:  # an engine allocates in its own runtime, unseen
                known[run.label] = peak_allocated_bytes(lambda d=decoder: self._short(d, ids), self.target.model.device)
        write_atomic(self.memory_path, json.dumps(known, indent=1))

    @staticmethod
    def _short(decoder: Decoder, ids: list[int]) -> Generation:
        limit, decoder.max_new_tokens = decoder.max_new_tokens, min(16, decoder.max_new_tokens)
        try:
            return decoder.generate(ids)
        finally:
            decoder.max_new_tokens = limit

    def memory(self) -> dict[str, int]:
        """Each label's peak allocation measured in this folder; a damaged memory.json is one line, not a traceback."""
        if not self.memory_path.exists():
            return {}
        try:
            known = json.loads(self.memory_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            known = None
        if not isinstance(known, dict) or not all(isinstance(v, (int, float)) for v in known.values()):
            raise SpecbenchError(f"{self.memory_path} is not a map of method label to bytes: delete it and it is "
                                 f"measured again")
        return known

    def _fields(self, run: MethodRun, gen: Generation) -> dict:
        params, nbytes = run.drafter.parameters_bytes()
        adaptive = getattr(getattr(run.drafter, "tree", None), "alpha_history", None)  # LLMCad's trigger, per step
        return ({"alpha_history": list(adaptive)} if adaptive is not None and len(adaptive) == len(gen.steps) else {}) | {
            "prompt_len": gen.prompt_len, "new_tokens": len(gen.tokens), "steps": len(gen.steps),
            "wall_time": gen.wall_time, "prefill_time": gen.prefill_time,
            "draft_time": sum(s.draft_time for s in gen.steps), "verify_time": sum(s.verify_time for s in gen.steps),
            "translate_time": getattr(run.drafter, "translate_time", 0.0),  # a draft of another tokenizer's, in draft_time
            "accept_lengths": gen.accept_lengths, "tree_sizes": [s.tree_size for s in gen.steps],
            "tree_depths": [s.tree_depth for s in gen.steps], "tried_deeper": [s.tried_deeper for s in gen.steps],
            "framework_times": [round(s.step_time - s.draft_time - s.verify_time, 7) for s in gen.steps],
            "output_ids": gen.tokens, "kv_peak_bytes": gen.kv_peak_bytes, "drafter_params": params,
            "drafter_bytes": nbytes, "accept": run.acceptance.name, "lossless_rule": run.acceptance.lossless,
            "temperature": self.sampling.temperature, "token_logprobs": [round(x, 5) for x in gen.token_logprobs],
        }

    def _postfix(self) -> str:
        frame = decoded(self.store.frame())
        return ", ".join(f"{name} {grp['new_tokens'].sum() / grp['wall_time'].sum():.1f} tok/s"
                         for name, grp in frame.groupby("method", sort=False))
