"""Where transformers' eager attention is faster than SDPA on this machine, per dtype: windows of key counts
(execution/attention.py says why a run switches). About ten seconds: one query row, plain decoding's shape, against 64
to 4,096 keys, for the model's own heads; cached per machine fingerprint and attention shape beside the machine
profiles, so every run on this machine switches at the same key counts (a bf16 token can depend on the kernel)."""

from __future__ import annotations

import json

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specbench.errors import SpecbenchError
from specbench.files import write_atomic
from specbench.hardware.measured.machine import fingerprint, machine_info
from specbench.hardware.measured.cache import measuring_alone, measuring_key, profile_dir, read_cached, stamp
from specbench.hardware.measured.peaks import best_seconds, default_dtypes
from specbench.execution.attention import Windows, eager_forward
from specbench.models.loading import torch_dtype

# dense enough to find where the kernels cross, which can be at a few hundred keys and again near two thousand
# (experiments/fast_forward)
CONTEXTS = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048, 3072, 4096)
MARGIN = 0.9  # eager must take at most 90% of SDPA's time: no switch is made on timing noise


def windows_of(timings: dict[int, tuple[float, float]]) -> Windows:
    """The key counts where eager runs: [c_i, c_i+1) when eager is faster by MARGIN at both measured ends (the last
    measured context's window has no end). timings: context -> (SDPA seconds, eager seconds)."""
    contexts = sorted(timings)
    wins = [timings[c][1] <= MARGIN * timings[c][0] for c in contexts]
    windows: Windows = []
    for i, c in enumerate(contexts):
        last = i == len(contexts) - 1
        if wins[i] and (last or wins[i + 1]):
            stop = None if last else contexts[i + 1]
            if windows and windows[-1][1] == c:
                windows[-1][1] = stop  # joins the window before it
            else:
                windows.append([c, stop])
    return windows


@torch.inference_mode()
def measure_windows(model: torch.nn.Module, dtype: str, contexts=CONTEXTS, budget_s: float = 0.15) -> tuple:
    """(eager windows, {context: (SDPA s, eager s)}) for one query row attending to each context's keys."""
    layer = next((m for m in model.modules() if hasattr(m, "num_key_value_groups")), None)
    if layer is None:
        raise SpecbenchError(f"{type(model).__name__} has no attention layer with num_key_value_groups; use "
                             f"model.attention=sdpa")
    cfg, device = model.config, next(model.parameters()).device
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    eager, timings = eager_forward(layer), {}
    for ctx in contexts:
        q = torch.randn(1, heads, 1, dim, device=device, dtype=torch_dtype(dtype))
        k, v = (torch.randn(1, kv_heads, ctx, dim, device=device, dtype=q.dtype) for _ in range(2))
        timings[ctx] = (best_seconds(lambda: sdpa_attention_forward(layer, q, k, v, None, scaling=dim**-0.5),  # noqa: B023
                                      sync, budget_s),
                        best_seconds(lambda: eager(layer, q, k, v, None, scaling=dim**-0.5), sync, budget_s))  # noqa: B023
    return windows_of(timings), timings


def eager_windows(model: torch.nn.Module, dtypes=None) -> dict[str, Windows]:
    """{dtype: the key counts where eager attention runs}, from the cache or measured now and cached."""
    device = next(model.parameters()).device
    dtypes = list(dtypes or default_dtypes(device))
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or max(CONTEXTS)
    contexts = [c for c in CONTEXTS if c <= limit]
    shape = f"{cfg.num_attention_heads}x{cfg.num_key_value_heads}x{cfg.hidden_size}"
    # named by the measuring key, as the machine profile is
    path = profile_dir() / f"{fingerprint()}-{measuring_key()}-{device.type}-attention-{shape}.json"
    seen = stamp(path)
    cached = read_cached(path, _windows_of_file) if seen else None
    if cached is not None and all(d in cached for d in dtypes):
        return {d: cached[d] for d in dtypes}
    with measuring_alone("where eager attention beats SDPA"):
        if stamp(path) != seen:  # written by the process this one waited for
            cached = read_cached(path, _windows_of_file)
            if cached is not None and all(d in cached for d in dtypes):
                return {d: cached[d] for d in dtypes}
        print(f"measuring where eager attention beats SDPA here ({', '.join(dtypes)}; seconds), cached at {path}")
        windows, timings = dict(cached or {}), {}
        for name in dtypes:
            windows[name], measured = measure_windows(model, name, contexts)
            timings[name] = {str(c): {"sdpa_ms": 1e3 * s, "eager_ms": 1e3 * e} for c, (s, e) in measured.items()}
        write_atomic(path, json.dumps({"machine": machine_info(), "eager_windows": windows, "timings": timings},
                                      indent=1))
    return {d: windows[d] for d in dtypes}


def _windows_of_file(text: str) -> dict:
    windows = json.loads(text).get("eager_windows")

    def valid(w) -> bool:
        return (isinstance(w, list) and len(w) == 2 and isinstance(w[0], int) and w[0] > 0
                and (w[1] is None or (isinstance(w[1], int) and w[1] > w[0])))
    if not isinstance(windows, dict) or not all(isinstance(ws, list) and all(valid(w) for w in ws)
                                                for ws in windows.values()):
        raise SpecbenchError(f"the machine profile holds eager_windows={windows!r}: it must map dtypes to lists of "
                             f"[from, to or null] key counts")
    return windows
