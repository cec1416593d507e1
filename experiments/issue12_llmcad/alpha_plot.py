"""Issue 12, must-show 2: LLMCad's verification threshold alpha over one generation, as a plot.

Decodes the first prompt of the dataset with method=llmcad (fp32 greedy by default) and plots, per verification
step, the alpha its tree was drafted under (log scale) beside the tree size and the draft tokens accepted.

    python experiments/issue12_llmcad/alpha_plot.py                          # SmolLM2-135M, first MT-Bench prompt
    python experiments/issue12_llmcad/alpha_plot.py tree.alpha_rule=prose out=experiments/issue12_llmcad/alpha_prose
Any key=value is a config override; out=PREFIX names PREFIX.png and PREFIX.csv (default:
experiments/issue12_llmcad/alpha).
"""

from __future__ import annotations

import sys

import matplotlib.pyplot as plt
import pandas as pd
from hydra import compose, initialize_config_dir

from specbench.config import CONF_DIR, build
from specbench.data.prompts import encode_conversation
from specbench.decoding import Decoder
from specbench.evaluation.methods import build_drafter
from specbench.sampling import SamplingParams
from specbench.tasks._common import setup_target


def main(argv: list[str]) -> pd.DataFrame:
    out = next((a.split("=", 1)[1] for a in argv if a.startswith("out=")), "experiments/issue12_llmcad/alpha")
    overrides = ["method=llmcad", "eval.dtype=float32", *(a for a in argv if not a.startswith("out="))]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    hw, target = setup_target(cfg)
    drafter = build_drafter(cfg.method.drafter, target, build(cfg.tree))
    prompt = next(iter(build(cfg.dataset)))
    ids = encode_conversation(target.tokenizer, prompt.turns[:1], [], target.chat_template)
    gen = Decoder(target.model, drafter, build(cfg.accept), SamplingParams(**cfg.sampling), cfg.eval.max_new_tokens,
                  target.eos_token_ids, seed=cfg.eval.seed, max_context=target.max_context).generate(ids)
    frame = pd.DataFrame({"step": range(1, len(gen.steps) + 1), "alpha": drafter.tree.alpha_history,
                          "tree_size": [s.tree_size for s in gen.steps], "accepted": [s.accepted for s in gen.steps]})
    frame.to_csv(f"{out}.csv", index=False)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    top.step(frame["step"], frame["alpha"], where="post")
    top.set(yscale="log", ylabel="alpha (drafted under)",
            title=f"{cfg.model.name}, {cfg.dataset.name} #{prompt.question_id}, alpha_rule={cfg.tree.alpha_rule}")
    bottom.bar(frame["step"], frame["tree_size"] - 1, color="lightgray", label="draft tokens verified")
    bottom.bar(frame["step"], frame["accepted"], label="accepted")
    bottom.set(xlabel="verification step", ylabel="tokens")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=120)
    print(f"{len(gen.steps)} steps, tau {sum(gen.accept_lengths) / max(len(gen.steps), 1):.2f}: {out}.png, {out}.csv")
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
