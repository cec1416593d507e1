"""task=profile: this machine's measured profile (peaks and L(n, context) per backend and dtype), cached per
fingerprint, printed, and set against the roofline of the measured peaks.

Contexts default to 128 and 1024 (`eval.profile_contexts=[128,512,1024,2048]` widens them); backends are
eval.profile_backends under model.backend=auto, else model.backend beside eager (the reference)."""

from __future__ import annotations

import pandas as pd

from specbench.hardware.measured.machine_profile import (
    as_spec,
    choose_execution,
    load_or_measure_profile,
    roofline_error,
)
from specbench.hardware.measured.profiler import weight_streaming
from specbench.hardware.modelled.plots import profile_vs_roofline
from specbench.models.backends import AUTO, check_backend, check_profile_backends
from specbench.models.shape import ModelShape
from specbench.tasks._common import run_dir, setup_target


def run(cfg) -> pd.DataFrame:
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    backend = cfg.model.backend
    check_backend(backend)
    backends = check_profile_backends(cfg.eval.profile_backends) if backend == AUTO \
        else list(dict.fromkeys(["eager", backend]))
    hw, target = setup_target(cfg)
    contexts = list(cfg.eval.profile_contexts)
    dtypes = None if cfg.eval.dtype == AUTO else [cfg.eval.dtype]
    profile = load_or_measure_profile(target, dtypes=dtypes, sizes=list(cfg.eval.profile_sizes), contexts=contexts,
                                      repeats=cfg.eval.profile_repeats, backends=backends)
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
                    & errors["tokens"].isin(list(cfg.eval.profile_sizes)) & errors["dtype"].isin(dtypes or errors["dtype"])]
    errors.to_csv(out / "profile_vs_roofline.csv", index=False)
    errors = errors.assign(x_roofline=errors["ms"] / errors["roofline_ms"], x_bound=errors["ms"] / errors["bound_ms"])
    with pd.option_context("display.width", 200, "display.precision", 1, "display.max_columns", 30):
        print("L(n) measured (ms); the roofline of the measured peaks with the measured per-layer fixed cost, and the "
              "bound without it (ms); measured / each:")
        for what in ("ms", "roofline_ms", "bound_ms", "x_roofline", "x_bound"):
            keys = ["dtype", "context"] if what.endswith("_ms") else ["backend", "dtype", "context"]
            print(f"{what}:")
            print(errors.pivot_table(index=keys, columns="tokens", values=what).to_string(
                float_format=lambda v: f"{v:.2f}" if what.startswith("x_") else f"{v:.1f}"))
    for name, reason in profile.machine.get("unsupported", {}).items():
        print(f"not measured: {name}: {reason}")
    for name, seconds in profile.compile_seconds.items():
        print(f"compile time {name}: {seconds:.0f} s (first forwards; inductor caches graphs across processes)")
    streaming = weight_streaming(target.model, [n for n in cfg.eval.profile_sizes if n <= 32])
    streaming.to_csv(out / "weight_streaming.csv", index=False)
    print(f"the model's linear layers multiplied one after another ({target.model.dtype}), against the "
          f"{peaks['mem_bandwidth_gbs']:.1f} GB/s a plain read reaches:")
    print(streaming.pivot_table(index="layout", columns="tokens", values=["ms", "gb_per_s"]).to_string(
        float_format=lambda v: f"{v:.1f}"))
    for n in (1, 8, 32):
        print(f"choose_execution(tree_size={n}): {choose_execution(profile, n, contexts[0], backends, dtypes)[2]}")
    title = (f"{target.name} on {info['cpu_model']} ({info['cpu_capability']}, {info['threads']} threads): "
             f"measured vs roofline of measured peaks")
    if "loadavg_1min" in info:
        before, after = info["loadavg_1min"]
        title += f"\n1-min load while measuring: {before:.1f} -> {after:.1f} on {info['cpus']} CPUs"
    print(f"plot: {profile_vs_roofline(errors, title, out / 'profile_vs_roofline.png')}")
    return errors
