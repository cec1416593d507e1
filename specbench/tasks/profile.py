"""task=profile: this machine's measured profile (peaks and L(n, context) per backend, dtype and weights), cached
per fingerprint, printed, and set against the roofline of the measured peaks; and how closely each quantised
target follows the float one (teacher-forced greedy agreement and perplexity on held-out ShareGPT conversations).

Contexts default to 128, 256 and 1024 (`eval.profile_contexts=[128,512,1024,2048]` widens them); backends are
eval.profile_backends under model.backend=auto, else model.backend beside eager (the reference); weights are
eval.profile_weights (and model.weights)."""

from __future__ import annotations

import pandas as pd

from specbench.data.prompts import HELD_OUT_FROM
from specbench.data.sharegpt import read_sharegpt
from specbench.evaluation.plan import run_weights
from specbench.hardware.measured.choice import choose_execution, fastest_plain
from specbench.hardware.measured.machine_profile import load_or_measure_profile
from specbench.hardware.measured.roofline_check import as_spec, roofline_error
from specbench.hardware.measured.profiler import latency_profile, weight_streaming
from specbench.hardware.modelled.plots import profile_vs_roofline
from specbench.execution.backends import AUTO, check_backend, check_profile_backends, with_backend
from specbench.execution.value import Execution
from specbench.models.loading import LoadedModel, with_dtype
from specbench.execution.quantize import agreement, with_weights
from specbench.models.shape import ModelShape
from specbench.tasks._common import run_dir, setup_target


def run(cfg) -> pd.DataFrame:
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    backend = cfg.model.backend
    check_backend(backend)
    backends = check_profile_backends(cfg.eval.profile_backends) if backend == AUTO \
        else list(dict.fromkeys(["eager", backend]))
    formats = run_weights(cfg)[1]
    hw, target = setup_target(cfg)
    contexts = list(cfg.eval.profile_contexts)
    dtypes = None if cfg.eval.dtype == AUTO else [cfg.eval.dtype]
    profile = load_or_measure_profile(target, dtypes=dtypes, sizes=list(cfg.eval.profile_sizes), contexts=contexts,
                                      repeats=cfg.eval.profile_repeats, backends=backends, weights=formats)
    (out / "machine_profile.json").write_text(profile.to_json())  # load_or_measure_profile warns if it was busy
    info = profile.machine
    peaks = profile.peaks
    print(f"machine: {info['cpu_model']} ({info['cpu_capability']}), {info['threads']} threads, "
          f"gpu {info['gpu_name']}, torch {info['torch_version']}")
    print("peak matmul TFLOP/s: " + ", ".join(f"{d} {v:.3f}" for d, v in peaks["peak_tflops"].items())
          + f"; memory read {peaks['mem_bandwidth_gbs']:.1f} GB/s; fixed cost {peaks['layer_overhead_ms']:.3f} ms"
          f" per layer; DRAM {peaks['memory_gb']:.1f} GB")
    errors = roofline_error(profile, ModelShape.of(target.model), as_spec(profile, hw))
    errors = errors[errors["backend"].isin(backends) & errors["context"].isin(contexts)
                    & errors["tokens"].isin(list(cfg.eval.profile_sizes)) & errors["dtype"].isin(dtypes or errors["dtype"])
                    & errors["weights"].isin(formats)]
    errors.to_csv(out / "profile_vs_roofline.csv", index=False)
    errors = errors.assign(x_roofline=errors["ms"] / errors["roofline_ms"], x_bound=errors["ms"] / errors["bound_ms"])
    with pd.option_context("display.width", 200, "display.precision", 1, "display.max_columns", 30):
        print("L(n) measured (ms); the roofline of the measured peaks with the measured per-layer fixed cost, and the "
              "bound without it (ms); measured / each:")
        for what in ("ms", "roofline_ms", "bound_ms", "x_roofline", "x_bound"):
            keys = ["roofline_dtype", "context"] if what.endswith("_ms") else ["backend", "dtype", "weights", "context"]
            print(f"{what}:")
            print(errors.pivot_table(index=keys, columns="tokens", values=what).to_string(
                float_format=lambda v: f"{v:.2f}" if what.startswith("x_") else f"{v:.1f}"))
    for name, reason in profile.machine.get("unsupported", {}).items():
        print(f"not measured: {name}: {reason}")
    checks = pd.DataFrame([{"execution": e.label, **profile.rows[e.label].as_dict()} for e in profile.executions
                           if e.label in profile.rows])
    if len(checks):
        checks.to_csv(out / "row_invariance.csv", index=False)
        print("row check: each execution's verify rows (chains of 2-16 rows and a branched tree, at each context) "
              "against plain decoding's one-row forwards; 'differs' is no lossless verify target here:")
        print(checks.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for name, seconds in profile.compile_seconds.items():
        print(f"compile time {name}: {seconds:.0f} s (first forwards; inductor caches graphs across processes)")
    streaming = weight_streaming(target.model, [n for n in cfg.eval.profile_sizes if n <= 32], weights=formats)
    streaming.to_csv(out / "weight_streaming.csv", index=False)
    print(f"the model's linear layers multiplied one after another ({target.model.dtype}), against the "
          f"{peaks['mem_bandwidth_gbs']:.1f} GB/s a plain read reaches:")
    print(streaming.pivot_table(index="layout", columns="tokens", values=["ms", "gb_per_s"]).to_string(
        float_format=lambda v: f"{v:.1f}"))
    for n in (1, 8, 32):
        print(f"choose_execution(tree_size={n}): "
              f"{choose_execution(profile, n, contexts[0], backends, dtypes, formats)[1]}")
    fusion = fusion_gain(target, profile, formats, contexts[0], cfg.eval.profile_repeats)
    if len(fusion):
        fusion.to_csv(out / "fusion.csv", index=False)
        print("the per-layer fixed cost that fusing q/k/v and gate/up into one GEMM each cuts: L(n) in ms with the "
              "projections apart and fused, each format on its fastest plain decoding's backend and dtype here:")
        print(fusion.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    fidelity = quantised_fidelity(target, profile, formats, contexts[0], cfg.eval.profile_agreement)
    if len(fidelity):
        fidelity.to_csv(out / "quantised_agreement.csv", index=False)
        print(f"each weight format, in the dtype of its fastest plain decoding here, against {target.name} in "
              f"{target.model.dtype} (teacher-forced over {cfg.eval.profile_agreement} held-out ShareGPT "
              f"conversations):")
        print(fidelity.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    host = f"{info['cpu_model']} ({info['cpu_capability']}, {info['threads']} threads)"
    on = f"{info['gpu_name']} (host {host})" if info.get("gpu_name") else host  # a GPU's profile times the GPU
    title = f"{target.name} on {on}: measured vs roofline of measured peaks"
    if "loadavg_1min" in info:
        before, after = info["loadavg_1min"]
        title += f"\n1-min load while measuring: {before:.1f} -> {after:.1f} on {info['cpus']} CPUs"
    print(f"plot: {profile_vs_roofline(errors, title, out / 'profile_vs_roofline.png')}")
    return errors


def quantised_fidelity(target: LoadedModel, profile, formats: list[str], context: float, conversations: int,
                       max_tokens: int = 512) -> pd.DataFrame:
    """agreement() of each format (fp included: the dtype alone) against `target` as loaded, each in the dtype its
    fastest plain decoding runs in per the profile, on `conversations` held-out ShareGPT conversations (the chat
    template, cut at max_tokens)."""
    if conversations <= 0:
        return pd.DataFrame()
    chats = read_sharegpt(HELD_OUT_FROM + conversations)[HELD_OUT_FROM:]
    sequences = [list(target.tokenizer.apply_chat_template(c, tokenize=True, return_dict=False))[:max_tokens]
                 if target.chat_template and getattr(target.tokenizer, "chat_template", None)
                 else target.tokenizer("\n\n".join(m["content"] for m in c))["input_ids"][:max_tokens] for c in chats]
    rows = []
    for fmt in formats:
        measured = [e for e in profile.executions if e.weights == fmt]
        if not measured:
            continue
        fastest = fastest_plain(profile, context, weights=[fmt])
        model = Execution("eager", fastest.dtype, fmt).apply(target).model
        rows.append({"weights": fmt, "dtype": fastest.dtype, "fastest_plain": fastest.label,
                     **agreement(target.model, model, sequences)})
    return pd.DataFrame(rows)


def fusion_gain(target: LoadedModel, profile, formats: list[str], context: int, repeats: int,
                sizes=(1, 8)) -> pd.DataFrame:
    """L(n) with q/k/v and gate/up apart and fused (execution/linears.py), side by side in this process, for each format
    on the backend and dtype of its fastest plain decoding here (fused layers need a backend that swaps linears:
    prepacked or a quantised format; eager float is transformers as it is)."""
    rows = []
    for fmt in formats:
        if not any(e.weights == fmt for e in profile.executions):
            continue
        backend, dtype, _ = fastest_plain(profile, context, weights=[fmt])
        if fmt == "fp" and backend != "prepacked":
            continue
        ms = {}
        for fuse in (False, True):
            cast = with_dtype(target if fmt == "fp" else with_weights(target, fmt, fuse=fuse), dtype)
            model = with_backend(cast, backend, fuse=fuse).model
            ms[fuse] = latency_profile(model, list(sizes), context, repeats, statistic="min")["ms"].tolist()
        for i, n in enumerate(sizes):
            rows.append({"execution": Execution(backend, dtype, fmt).label, "tokens": n, "apart_ms": ms[False][i],
                         "fused_ms": ms[True][i], "saved_ms": ms[False][i] - ms[True][i]})
    return pd.DataFrame(rows)
