"""Draft step cost against a target step at several draft-vocabulary sizes, with the coverage of the target's argmax.

The cost of a draft head does not depend on its weights, so each size gets a head of that vocabulary (random
weights, the target's dtype) and the drafter's own measurement (EagleDrafter.draft_ms, what tree=hardware_aware
uses), with the head on each backend the run may put it on (Drafter.on_backend), side by side in one process; the
target's step is hardware.measured.profiler's L(n) on the same backends. Coverage is the
share of the held-out self-distilled response tokens (the target's greedy argmax) inside the `size` most frequent
tokens of the training responses, the draft vocabulary task=train would pick.

    python experiments/eagle/draft_cost.py [--sizes 2048 6144 16384 49152] [--rounds 5] [--out experiments/eagle/draft_cost.csv]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, build
from specbench.tasks._common import build_model
from specbench.drafters.eagle import LEVEL_ROWS, EagleDrafter, EagleHead, feature_layers
from specbench.hardware.measured.profiler import latency_profile
from specbench.models.artifact import save_artifact
from specbench.execution.backends import supported, with_backend
from specbench.models.loading import cache_root
from specbench.training.datamodule import ShareGPTDataModule
from specbench.training.eagle import draft_vocabulary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 6144, 16384, 49152])
    parser.add_argument("--context", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating measurements per backend, the fastest kept (a whole number >= 1)")
    parser.add_argument("--out", type=Path, default=Path("experiments/eagle/draft_cost.csv"))
    args = parser.parse_args()
    if args.rounds < 1:  # 0 rounds would leave every size without its timings
        parser.error(f"--rounds {args.rounds} is invalid: give a whole number >= 1")
    torch.manual_seed(0)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["method=eagle", "model=smollm2_135m"])
    data_cfg = cfg.method.train.data
    target = build_model(cfg.model, dtype="bfloat16")
    data = ShareGPTDataModule(target.tokenizer, data_cfg.num_conversations, data_cfg.num_val, data_cfg.max_length,
                              self_distill=OmegaConf.to_container(data_cfg.self_distill), generator=target,
                              cache_dir=cache_root() / "training")
    data.setup("fit")
    held_out = torch.tensor([t for e in data.val_set for t, m in zip(e.input_ids, e.loss_mask) if m])
    config = target.model.config
    dynamic = build(cfg.tree)  # method=eagle's default: EAGLE-2's dynamic tree
    backends = [b for b in ("eager", "prepacked") if supported(b, torch.bfloat16, torch.device("cpu")) is None]
    steps = {f"target L({n}) {backend}": row.ms for backend in backends
             for n, row in latency_profile(with_backend(target, backend).model, sizes=(1, dynamic.budget),
                                           context=args.context).set_index("tokens").iterrows()}
    rows = []
    for size in args.sizes:
        d2t = draft_vocabulary(data.train_set, config.vocab_size, size)
        head = EagleHead(config, feature_layers(config.num_hidden_layers, "fused"), size)
        head.d2t.copy_(d2t)
        arch = {"features": "fused", "feature_layers": list(head.layers), "draft_vocab": size}
        with tempfile.TemporaryDirectory() as tmp:
            path = save_artifact(Path(tmp) / "head", "eagle", target, arch,
                                 {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                                  for k, v in head.state_dict().items()}, metrics={"rank_accuracy": [[0.5]]})
            drafters = {backend: EagleDrafter(target, dynamic, str(path)) for backend in backends}
        for backend, drafter in drafters.items():  # eager: the head as built (on_backend would time it against packed)
            if backend != "eager":
                drafter.on_backend(lambda model: with_backend(model, backend))  # noqa: B023 (called at once)
        # EAGLE-2's default tree: the root's forward, then depth - 1 deeper levels of top_k nodes each
        tree = [[0] * d + [k] for d in range(dynamic.depth) for k in range(dynamic.top_k)]
        params = sum(p.numel() for p in drafters["eager"].head.parameters())
        row = {"draft_vocab": size, "coverage": float(torch.isin(held_out, d2t).float().mean()),
               "head_params_M": params / 1e6, "artifact_MB_bf16": params * 2 / 1e6}
        for _ in range(args.rounds):  # backends alternate, each keeps its fastest round: noise only adds time
            for backend, drafter in drafters.items():
                drafter._level_ms = None  # measure again
                for key, ms in ((f"expand_ms_1_row {backend}", drafter._expand_ms(1)),
                                (f"expand_ms_4_rows {backend}", drafter._expand_ms(4)),
                                (f"dynamic_tree_draft_ms {backend}", drafter.draft_ms(tree))):
                    row[key] = min(row.get(key, float("inf")), ms)
        rows.append(row | steps)
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.precision", 3):
        print(frame.to_string(index=False))
    print(f"measured rows per expand: {LEVEL_ROWS}; context {args.context}; {torch.get_num_threads()} threads; "
          f"{torch.backends.cpu.get_cpu_capability()}")


if __name__ == "__main__":
    main()
