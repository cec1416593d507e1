"""task=calibrate: per-depth, per-rank acceptance probabilities of the method's drafter on the dataset, saved as
the JSON that tree=greedy reads (`+calibration.out=FILE`, `+calibration.depth=5`, `+calibration.ranks=8`)."""

from __future__ import annotations

from pathlib import Path

from specbench.config import build
from specbench.data.prompts import encode_prompt
from specbench.drafters.base import TreeTooDeep
from specbench.errors import SpecbenchError
from specbench.evaluation.calibration import calibrate, probe_tree
from specbench.evaluation.methods import build_drafter, drafter_class
from specbench.tasks._common import build_model, load_dtype

DEPTH = 5  # the depths calibrated unless +calibration.depth says, or the drafter drafts fewer


def run(cfg) -> Path:
    """Calibrate cfg.method's drafter on cfg.dataset and write the JSON that tree=greedy reads."""
    opts = cfg.get("calibration", {}) or {}
    depth, ranks = int(opts.get("depth", DEPTH)), int(opts.get("ranks", 8))
    num_prompts = int(opts.get("num_prompts", cfg.eval.num_prompts))
    max_new_tokens = int(opts.get("max_new_tokens", cfg.eval.max_new_tokens))
    target = build_model(cfg.model, dtype=load_dtype(cfg))
    # a drafter that takes tree policies is probed with the rank-0 chain and all its siblings; a native one drafts
    # its own tree, whose accepted nodes are scored all the same
    probes = "static" in drafter_class(cfg.method.drafter).tree_policies
    try:
        drafter = build_drafter(cfg.method.drafter, target, probe_tree(depth, ranks) if probes else build(cfg.tree))
    except TreeTooDeep as exc:  # a drafter of fewer depths (Medusa: one per head)
        if not probes or "depth" in opts:
            raise SpecbenchError(f"calibration.depth={depth} is invalid for method={cfg.method.name}: it drafts at "
                                 f"most {exc.deepest} tokens deep, so give +calibration.depth={exc.deepest} or "
                                 f"less") from None
        depth = exc.deepest
        print(f"calibration.depth={depth}: method={cfg.method.name} drafts no deeper ({DEPTH} is the default)")
        drafter = build_drafter(cfg.method.drafter, target, probe_tree(depth, ranks))
    dataset = list(build(cfg.dataset))[:num_prompts]
    prompts = [encode_prompt(target.tokenizer, p, target.chat_template) for p in dataset]
    calibration = calibrate(target.model, drafter, prompts, depth, ranks, max_new_tokens, target.eos_token_ids)
    out = opts.get("out") or f"outputs/calibration/{cfg.method.name}_{target.name}_{cfg.dataset.name}.json"
    path = calibration.save(out, drafter=cfg.method.name, model=target.name, dataset=cfg.dataset.name,
                            prompts=len(prompts), max_new_tokens=max_new_tokens)
    print(f"accept_prob by depth (rows) and rank (columns), saved to {path}:")
    for level, row in enumerate(calibration.accept_prob, 1):
        print(f"  depth {level}: " + " ".join(f"{a:.3f}" for a in row))
    return path
