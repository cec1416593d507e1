"""The openvino route's step beside the engines' on this machine, measured side by side in one process, interleaved.

For each context (the same random prompt of that many tokens for every side): our route's verify of n rows, L(n)
for n = 1, 2, 4, 8, 16 (a chain of n rows on the prompt's cache, then the cache returned to the prompt, as a
rejected draft leaves it), and the engines' one-row step: OpenVINO GenAI's LLMPipeline on an IR of the same float
weights compressed the same way, with its default attention backend (paged attention) and with its stateful SDPA
one (the KV cache held as the runtime's state), each step timed by its streamer; and llama.cpp on the GGUF as
shipped, one eval of one token. Every side runs in turn for --rounds rounds; the median step of each is printed
with its ratio to each engine's one-row step, and the prompt's own time (ours projecting only the last row's
logits, and every row's). The roofline: bytes a one-row step reads (the weights' file, the KV cache it attends
over in the format it holds it) over the bandwidth measured here, and FLOPs a row. With --profile, OpenVINO's
per-op counters (PERF_COUNT) of our one-row and 16-row calls: the fully connected layers, the attention's MatMuls,
the rest, and the call's wall time beyond them.

    python experiments/openvino_engine_speed/step_speed.py [--contexts 128 512 1024 2048] [--weights int4_g64]
        [--rounds 3] [--steps 16] [--profile] [--out experiments/openvino_engine_speed/steps.csv]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

import specbench  # noqa: F401  before torch: it shortens OpenMP's spin (specbench/openmp.py)
import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from transformers import DynamicCache

from specbench.config import CONF_DIR
from specbench.execution.value import Execution
from specbench.hardware.measured.peaks import best_seconds
from specbench.models.loading import load_model, resolve_path
from specbench.models.shape import head_dim
from specbench.trees.token_tree import TokenTree
from specbench.verification import verify_tree

ROWS = (1, 2, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--weights", default="int4_g64", help="the openvino route's weights (and GenAI's IR's)")
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16, help="steps timed per side and round")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={args.model}"])
    loaded = load_model(cfg.model.name, cfg.model.path, dtype="float32")
    sides = {"ours": Ours(loaded, args.weights), "genai": GenAI(loaded, args.weights, threads, "PA"),
             "genai_sdpa": GenAI(loaded, args.weights, threads, "SDPA"),
             "llama_cpp": LlamaCpp(cfg.model.path, max(args.contexts) + args.steps + 32, threads)}
    generator = torch.Generator().manual_seed(0)
    records = []
    for context in args.contexts:
        prompt = torch.randint(100, loaded.model.config.vocab_size - 100, (context,), generator=generator).tolist()
        steps, prefill = collections.defaultdict(list), collections.defaultdict(list)
        for side in sides.values():
            side.run(prompt[:64], 2)  # warm: each side's shapes compiled and its caches allocated once
        for _ in range(args.rounds):
            for name, side in sides.items():
                got, first = side.run(prompt, args.steps)
                for key, times in got.items():
                    steps[(name, key)] += times
                for key, seconds in first.items():
                    prefill[(name, key)].append(seconds)
        for (name, rows), times in sorted(steps.items()):
            records.append({"context": context, "side": name, "rows": rows, "ms": statistics.median(times)})
        for (name, key), times in sorted(prefill.items()):
            records.append({"context": context, "side": f"{name} prompt ({key})", "rows": context,
                            "ms": statistics.median(times)})
        table = pd.DataFrame([r for r in records if r["context"] == context]).set_index(["side", "rows"])
        one = {engine: table.loc[(engine, 1), "ms"] for engine in ("genai", "genai_sdpa", "llama_cpp")}
        for engine, ms in one.items():
            table[f"/ {engine} step"] = (table["ms"] / ms).round(2)
        print(f"\ncontext {context} ({threads} threads), ms (median of {args.rounds} x {args.steps}):")
        print(table.round(2).to_string())
    frame = pd.DataFrame(records)
    roofline(loaded, sides, args.contexts)
    if args.profile:
        profile(loaded, args.weights, args.contexts, generator)
    if args.out:
        frame.to_csv(args.out, index=False)
        print(f"\nwritten: {args.out}")


class Ours:
    """The openvino route (model.backend=openvino, model.weights=WEIGHTS) as the decoder runs it."""

    def __init__(self, loaded, weights: str) -> None:
        from specbench.execution.openvino.attention import ATTENTION
        from specbench.execution.openvino.export import ir_folder

        self.model = Execution("openvino", "float32", weights).apply(loaded).model
        self.folder = ir_folder(loaded, f"forward-{weights}", ATTENTION)

    @torch.inference_mode()
    def run(self, prompt: list[int], steps: int):
        ids = torch.tensor([prompt])
        first = {}
        for keep, key in ((0, "every row's logits"), (1, "last row's logits")):
            cache = DynamicCache(config=self.model.config)
            start = time.perf_counter()
            self.model(input_ids=ids, past_key_values=cache, logits_to_keep=keep)
            first[key] = (time.perf_counter() - start) * 1000
        return chain_steps(self.model, cache, prompt, ROWS, steps), first


def chain_steps(model, cache, prompt: list[int], counts, steps: int) -> dict:
    """{rows: ms of each of `steps` verifies of a chain of that many rows on `cache`, each cropped back after, as a
    rejected draft leaves it}."""
    got = {}
    for rows in counts:
        chain, times = TokenTree.chain(prompt[0], prompt[1:rows]), []
        for _ in range(steps):
            start = time.perf_counter()
            verify_tree(model, cache, chain)
            times.append((time.perf_counter() - start) * 1000)
            cache.crop(-rows)
        got[rows] = times
    return got


class GenAI:
    """OpenVINO GenAI's LLMPipeline (the project's `openvino` engine) with attention backend BACKEND."""

    def __init__(self, loaded, weights: str, threads: int, backend: str) -> None:
        import openvino_genai as og

        from specbench.engines.openvino import export

        self.og = og
        self.folder = export(loaded, weights)
        self.pipe = og.LLMPipeline(str(self.folder), "CPU", INFERENCE_NUM_THREADS=threads,
                                   PERFORMANCE_HINT="LATENCY", ATTENTION_BACKEND=backend)

    def run(self, prompt: list[int], steps: int):
        import openvino as ov

        og, stamps = self.og, []

        class Stamps(og.StreamerBase):
            def write(self, token):
                stamps.append(time.perf_counter())
                return og.StreamingStatus.RUNNING

            def end(self):
                pass

        config = og.GenerationConfig()
        config.max_new_tokens, config.do_sample, config.ignore_eos = steps + 1, False, True
        ids = np.asarray([prompt], dtype=np.int64)
        start = time.perf_counter()
        self.pipe.generate(og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config, Stamps())
        return {1: list(np.diff(stamps) * 1000)}, {"first token": (stamps[0] - start) * 1000}


class LlamaCpp:
    """llama-cpp-python on the model's GGUF as shipped."""

    def __init__(self, path: str, n_ctx: int, threads: int) -> None:
        import llama_cpp

        self.gguf = resolve_path(path)
        self.llm = llama_cpp.Llama(model_path=str(self.gguf), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, n_batch=512, verbose=False)

    def run(self, prompt: list[int], steps: int):
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt)
        first, times = (time.perf_counter() - start) * 1000, []
        for token in prompt[:steps]:
            start = time.perf_counter()
            self.llm.eval([token])
            times.append((time.perf_counter() - start) * 1000)
        return {1: times}, {"prompt eval": first}


def roofline(loaded, sides: dict, contexts: list[int]) -> None:
    """Bytes a one-row step reads (weights as stored, the KV cache as each side holds it) over this machine's
    measured bandwidth, and FLOPs a row."""
    from specbench.execution.openvino.forward import CACHE_STEP

    config = loaded.model.config
    x = torch.ones(256 * 2**18)  # 256 MB of float32
    bandwidth = x.numel() * 4 / best_seconds(x.sum, lambda: None, 1.0)
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config)  # K and V elements
    ours_bin = sum(p.stat().st_size for p in sides["ours"].folder.glob("openvino_model.bin"))
    genai_bin = sum(p.stat().st_size for p in sides["genai"].folder.glob("openvino_model.bin"))
    gguf = sides["llama_cpp"].gguf.stat().st_size
    linear = sum(m.weight.numel() for m in loaded.model.modules() if isinstance(m, torch.nn.Linear))
    print(f"\nroofline: read bandwidth {bandwidth / 1e9:.1f} GB/s; weights {ours_bin / 1e6:.0f} MB (ours), "
          f"{genai_bin / 1e6:.0f} MB (GenAI's IR), {gguf / 1e6:.0f} MB (GGUF)")
    for context in contexts:
        capacity = -(-(context + 1) // CACHE_STEP) * CACHE_STEP  # ours attends over its buffer's capacity
        kv = {"ours": per_token * capacity * 4, "genai": per_token * context * 1, "llama_cpp": per_token * context * 2}
        flops = 2 * linear + 4 * config.num_hidden_layers * config.num_attention_heads * head_dim(config) * context
        reads = {name: (weights + kv[name]) for name, weights in
                 (("ours", ours_bin), ("genai", genai_bin), ("llama_cpp", gguf))}
        print(f"  context {context}: " + ", ".join(f"{name} {b / 1e6:.0f} MB = {1e3 * b / bandwidth:.1f} ms"
                                                   for name, b in reads.items())
              + f" (KV f32 / u8 / f16); {flops / 1e9:.2f} GFLOP a row")


def profile(loaded, weights: str, contexts: list[int], generator) -> None:
    """OpenVINO's per-op counters of our one-row and 16-row calls at each context."""
    from specbench.execution.openvino import route

    route.PROPERTIES = route.PROPERTIES | {"PERF_COUNT": True}
    model = route.with_openvino(loaded, weights).model
    import openvino as ov

    print("\nper-op counters (ms) of our calls, PERF_COUNT on:")
    for context in contexts:
        prompt = torch.randint(100, 40000, (context,), generator=generator).tolist()
        for rows in (1, 16):
            cache = DynamicCache(config=model.config)
            with torch.inference_mode():
                model(input_ids=torch.tensor([prompt]), past_key_values=cache, logits_to_keep=1)
                # the request the call runs: the static model of its rows and its buffer's capacity where there is one
                _, request = model._sized(rows, model.buffers.holding(cache, context + rows).capacity)
                walls, infers, real = [], [], request.infer

                def timed(*a, **k):
                    start = time.perf_counter()
                    out = real(*a, **k)
                    infers.append((time.perf_counter() - start) * 1000)
                    return out

                request.infer = timed
                chain = TokenTree.chain(prompt[0], prompt[1:rows])
                for _ in range(12):
                    start = time.perf_counter()
                    verify_tree(model, cache, chain)
                    walls.append((time.perf_counter() - start) * 1000)
                    cache.crop(-rows)
                del request.infer
            ops = collections.Counter()
            for info in request.get_profiling_info():
                if info.status == ov.ProfilingInfo.Status.EXECUTED:
                    kind = info.node_type if info.node_type in ("FullyConnectedCompressed", "MatMul") else "other"
                    ops[kind] += info.real_time.total_seconds() * 1000
            infer = statistics.median(infers)
            print(f"  context {context}, {rows} rows: call {statistics.median(walls):.2f}, infer {infer:.2f}, ops "
                  f"{sum(ops.values()):.2f} = FC {ops['FullyConnectedCompressed']:.2f} + attention MatMul "
                  f"{ops['MatMul']:.2f} + other {ops['other']:.2f}; infer beyond its ops "
                  f"{infer - sum(ops.values()):.2f}")


if __name__ == "__main__":
    main()
