"""task=replay: a drafter that drafts from tokens alone replayed against a finished run's plain-decoding answers.

    python run.py task=replay method=sssd tree.budget=4 replay.run=experiments/openvino_row_invariant
    python run.py -m task=replay method=sssd tree.budget=4,8 method.drafter.input_discount=0.5,1.0 replay.run=RUN

Each job prints tau and writes summary.csv (one row: tau, steps, the drafter's own ms a step) and replay.csv (one row
per answer) into its folder; a sweep's sweep_summary.csv gathers them (reporting/sweep.py). The model and dataset
must be the run's (its prompts are encoded again and their lengths checked against the records), and the answers
greedy. Why and what is not replayed: evaluation/replay.py.
"""

from __future__ import annotations

import time

import pandas as pd

from specbench.config import build
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import build_drafter, drafter_class
from specbench.evaluation.metrics import decode_tau
from specbench.evaluation.replay import replay_answers
from specbench.evaluation.run_folder import RECORDS_FILE, read_records
from specbench.reporting.paper_table import project_path
from specbench.tasks._common import build_model, run_dir


def run(cfg) -> pd.DataFrame:
    """Replay cfg.method's drafter on replay.run's answers of replay.reference; the summary row."""
    records = _answers(cfg)  # every setting and the folder checked before the model loads
    target = build_model(cfg.model, dtype="float32")
    drafter = build_drafter(cfg.method.drafter, target, build(cfg.tree))
    prompts = {p.question_id: p for p in build(cfg.dataset, num_prompts=None)}  # whichever the run took
    rows, start = [], time.perf_counter()
    # in the run's order, as a drafter learning across answers met them (suffix's global tree)
    for record, out in replay_answers(drafter, records, prompts, target.tokenizer, target.chat_template,
                                      target.max_context):
        rows.append({"question_id": record["question_id"], "turn": record["turn"], "steps": out.steps,
                     "new_tokens": len(record["output_ids"]), "recorded_steps": record["steps"],
                     "draft_ms": 1e3 * out.draft_s})
    per_answer = pd.DataFrame(rows)
    steps = per_answer["steps"].sum()
    summary = pd.DataFrame([{
        "method": cfg.method.name, "tree_budget": cfg.tree.get("budget"),
        "tau": decode_tau(per_answer["new_tokens"], steps), "steps": int(steps), "answers": len(per_answer),
        "draft_ms_per_step": per_answer["draft_ms"].sum() / steps if steps else float("nan"),
        "reference": cfg.replay.reference,
        "reference_tau": decode_tau(per_answer["new_tokens"], per_answer["recorded_steps"].sum()),
        "replayed_from": str(cfg.replay.run)}])
    out_dir = run_dir(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_answer.to_csv(out_dir / "replay.csv", index=False)
    summary.to_csv(out_dir / "summary.csv", index=False)
    row = summary.iloc[0]
    print(f"{cfg.method.name} (tree.budget={row['tree_budget']}): tau {row['tau']:.3f} over {row['answers']} answers "
          f"of {cfg.replay.reference} in {cfg.replay.run}, drafting {row['draft_ms_per_step']:.2f} ms a step "
          f"({time.perf_counter() - start:.1f} s); {out_dir}")
    return summary


def _answers(cfg) -> list[dict]:
    """The reference's greedy answers in replay.run, after checking that this method and run can be replayed."""
    opts = cfg.get("replay") or {}
    if not opts.get("run"):
        raise SpecbenchError("task=replay needs replay.run=<a run folder whose records.jsonl holds plain decoding's "
                             "answers>, e.g. replay.run=experiments/openvino_row_invariant")
    if not drafter_class(cfg.method.drafter).drafts_from_tokens:
        raise SpecbenchError(f"method={cfg.method.name} drafts from the target's outputs, which a replay does not "
                             f"have: task=replay takes drafters that draft from tokens alone "
                             f"(method=sssd, pld or suffix)")
    if float(cfg.sampling.temperature) != 0:
        raise SpecbenchError(f"sampling.temperature={cfg.sampling.temperature} is invalid for task=replay: a replay "
                             f"follows greedy exact acceptance (temperature 0)")
    path = project_path(cfg.replay.run) / RECORDS_FILE
    if not path.is_file():
        raise SpecbenchError(f"replay.run={cfg.replay.run} has no {RECORDS_FILE}: give a finished run's folder")
    records = read_records(path)  # a damaged line is one error naming it
    labels = sorted({r.get("method") for r in records if r.get("method")})
    mine = [r for r in records if r.get("method") == cfg.replay.reference and not r.get("skipped")]
    if not mine:
        raise SpecbenchError(f"replay.reference={cfg.replay.reference} has no answers in {path}; its methods: "
                             f"{', '.join(labels)}")
    for key, want in (("model", cfg.model.name), ("dataset", cfg.dataset.name), ("temperature", 0)):
        found = {r.get(key) for r in mine}
        if found != {want}:
            raise SpecbenchError(f"replay.run's {cfg.replay.reference} answers have {key} "
                                 f"{', '.join(map(str, sorted(found, key=str)))}, not {want}: "
                                 + ("a replay needs greedy answers" if key == "temperature"
                                    else f"give {key}= the run's"))
    return mine
