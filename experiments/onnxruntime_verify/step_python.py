"""Where the onnxruntime route's plain step loses to ONNX Runtime GenAI's at a short context: the session's run, and the
Python between two runs, in situ and alone; side by side in one process, interleaved.

Three sides decode one chat prompt, greedy: our Decoder's plain decoding (every method's loop), a bare loop of the
route's forward and numpy's argmax (the least Python a forward can be driven by), and ONNX Runtime GenAI's generator
on the builder's model of the same weights. For ours, each session run is timestamped: the median run, and the median
Python from a run's return to the next run's call, in situ and again with the run replaced by nothing (the same code
with warm caches). The gap between the two is what a run evicts (experiments/onnxruntime_verify/README.md).

    python experiments/onnxruntime_verify/step_python.py [--rounds 6] [--tokens 96]
"""

from __future__ import annotations

import argparse
import statistics
import time

import specbench  # noqa: F401  before torch: it shortens OpenMP's spin (specbench/openmp.py)
import numpy as np
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.config import CONF_DIR
from specbench.decoding import Decoder
from specbench.drafters.plain import PlainDrafter
from specbench.engines.onnxruntime import OnnxRuntimeEngine
from specbench.execution.onnxruntime import export
from specbench.execution.value import Execution
from specbench.models.loading import load_model
from specbench.sampling import SamplingParams

PROMPT = "Explain the difference between TCP and UDP to a high school student."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={args.model}"])
    loaded = load_model(cfg.model.name, cfg.model.path, dtype="float32")
    model = Execution("onnxruntime", "float32", "int4_g32").apply(loaded).model
    engine = OnnxRuntimeEngine(export(loaded, "int4_g32"), "int4_g32", args.tokens, set(), torch.get_num_threads())
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
    decoder = Decoder(model, PlainDrafter(), ExactAcceptance(), SamplingParams(), args.tokens, [], max_context=8192)
    timed = TimedRuns(model.session)

    @torch.inference_mode()
    def bare() -> float:
        cache = DynamicCache(config=model.config)
        out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, logits_to_keep=1)
        token = int(np.argmax(out.logits[0, -1].numpy()))
        start = time.perf_counter()
        for _ in range(args.tokens - 1):
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache)
            token = int(np.argmax(out.logits[0, -1].numpy()))
        return (time.perf_counter() - start) * 1e3 / (args.tokens - 1)

    def decoded(generation) -> float:
        return (generation.wall_time - generation.prefill_time) * 1e3 / (len(generation.tokens) - 1)

    sides = {"our Decoder, plain": lambda: decoded(decoder.generate(prompt)), "bare forward loop": bare,
             "ONNX Runtime GenAI": lambda: decoded(engine.generate(prompt))}
    ms = {side: [] for side in sides}
    runs = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, decode in sides.items():
            timed.marks.clear()
            ms[side].append(decode())
            if timed.marks:
                runs[side].append(timed.split())
    alone = {}
    timed.replace_run = True  # the same Python, its caches warm
    for side in ("our Decoder, plain", "bare forward loop"):
        timed.marks.clear()
        sides[side]()
        alone[side] = timed.split()[1]
    genai = statistics.median(ms["ONNX Runtime GenAI"])
    print(f"{'side':20s} {'decode ms/token':>16s} {'vs GenAI':>9s} {'run ms':>7s} {'python between runs, in situ / alone, ms':>42s}")
    for side, values in ms.items():
        step = statistics.median(values)
        row = f"{side:20s} {step:16.2f} {step / genai:8.3f}x"
        if runs[side]:
            run = statistics.median(r[0] for r in runs[side])
            python = statistics.median(r[1] for r in runs[side])
            row += f" {run:7.2f} {python:27.3f} / {alone[side]:.3f}"
        print(row)


class TimedRuns:
    """The session's run wrapped: a timestamp at its call and its return (or, with replace_run, nothing run)."""

    def __init__(self, session) -> None:
        self.marks: list[float] = []
        self.replace_run = False
        run = session.run_with_iobinding

        def timed(binding) -> None:
            self.marks.append(time.perf_counter())
            if not self.replace_run:
                run(binding)
            self.marks.append(time.perf_counter())

        session.run_with_iobinding = timed

    def split(self) -> tuple[float, float]:
        """(median run, median Python from a run's return to the next run's call), ms; the prompt's run left out."""
        marks = self.marks[2:]
        runs = [marks[i + 1] - marks[i] for i in range(0, len(marks) - 1, 2)]
        gaps = [marks[i + 1] - marks[i] for i in range(1, len(marks) - 1, 2)]
        return statistics.median(runs) * 1e3, statistics.median(gaps) * 1e3


if __name__ == "__main__":
    main()
