"""A prompt's prefill on the openvino route beside OpenVINO GenAI's, measured side by side in one process, interleaved.

For each prompt length, on an empty cache with the last row's logits projected: our route's split-attention IR (the
dynamic-shape model every other long call runs, what a prefill ran before the prefill IR), the route as built (its
prefill IR: attention.prefill_attention), the same projecting every row's logits (what the decoder's prefill asked
for before it kept the last row's only), and OpenVINO GenAI's LLMPipeline (paged attention, prefix caching off)
generating one token on an IR of the same float weights compressed the same way. Each round draws a fresh random
prompt for all sides (a repeated one would hit a prefix cache); the best of --rounds rounds is printed, with the
largest difference between our two IRs' logits.

    python experiments/openvino_engine_speed/prefill_speed.py [--sizes 512 1024 2048] [--weights int8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import specbench  # noqa: F401  before torch: it shortens OpenMP's spin (specbench/openmp.py)
import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

from specbench.config import CONF_DIR
from specbench.execution.openvino.attention import ATTENTION
from specbench.execution.openvino.compile import compiled
from specbench.execution.openvino.export import exported
from specbench.execution.openvino.forward import OpenVinoForward
from specbench.execution.value import Execution
from specbench.models.loading import load_model, with_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--weights", default="int8",
                        help="fp, int8 or int4_g<group>: the openvino route's weights (and GenAI's IR's)")
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={args.model}"])
    loaded = load_model(cfg.model.name, cfg.model.path, dtype="float32")
    route = Execution("openvino", "float32", args.weights).apply(loaded).model
    fp32 = with_dtype(loaded, "float32")
    split = OpenVinoForward(fp32.model, compiled(exported(fp32, args.weights, ATTENTION)))
    sides = {"ours, split attention": Ours(split), "ours, prefill IR": Ours(route),
             "ours, prefill IR, every row's logits": Ours(route, keep=0),
             "GenAI (paged, no prefix cache)": GenAI(loaded, args.weights, args.threads)}
    generator = torch.Generator().manual_seed(0)
    vocab = loaded.model.config.vocab_size
    rows = []
    for size in args.sizes:
        best, logits = {name: float("inf") for name in sides}, {}
        for side in sides.values():  # warm: each side's shapes prepared once
            side.run(torch.randint(100, vocab - 100, (size,), generator=generator).tolist())
        for _ in range(args.rounds):
            prompt = torch.randint(100, vocab - 100, (size,), generator=generator).tolist()
            for name, side in sides.items():
                seconds, logits[name] = side.run(prompt)
                best[name] = min(best[name], seconds)
        ours = [logits["ours, split attention"], logits["ours, prefill IR"]]
        rows.append({"tokens": size, **{name: round(s * 1000) for name, s in best.items()},
                     "prefill IR / split": round(best["ours, prefill IR"] / best["ours, split attention"], 2),
                     "prefill IR / GenAI": round(best["ours, prefill IR"] / best["GenAI (paged, no prefix cache)"], 2),
                     "max |logit diff|": float((ours[0] - ours[1]).abs().max())})
    print(f"\nprefill, ms (best of {args.rounds}, {args.threads} threads, {args.weights} weights):")
    print(pd.DataFrame(rows).set_index("tokens").to_string())


class Ours:
    """An OpenVinoForward's prefill as the decoder calls it: an empty cache, the last row's logits (keep=0: every
    row's, as the decoder asked for before it kept the last row's only)."""

    def __init__(self, model: OpenVinoForward, keep: int = 1) -> None:
        self.model, self.keep = model, keep

    @torch.inference_mode()
    def run(self, prompt: list[int]):
        start = time.perf_counter()
        out = self.model(input_ids=torch.tensor([prompt]), past_key_values=DynamicCache(config=self.model.config),
                         logits_to_keep=self.keep)
        return time.perf_counter() - start, out.logits[0, -1]


class GenAI:
    """OpenVINO GenAI's LLMPipeline (paged attention) with prefix caching off, generating one token."""

    def __init__(self, loaded, weights: str, threads: int) -> None:
        import openvino_genai as og

        from specbench.engines.openvino import export

        self.og = og
        scheduler = og.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        self.pipe = og.LLMPipeline(str(export(loaded, weights)), "CPU", scheduler_config=scheduler,
                                   INFERENCE_NUM_THREADS=threads, PERFORMANCE_HINT="LATENCY")
        self.config = og.GenerationConfig()
        self.config.max_new_tokens, self.config.do_sample, self.config.ignore_eos = 1, False, True

    def run(self, prompt: list[int]):
        import openvino as ov

        ids = np.asarray([prompt], dtype=np.int64)
        inputs = self.og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        start = time.perf_counter()
        self.pipe.generate(inputs, self.config)
        return time.perf_counter() - start, None


if __name__ == "__main__":
    main()
