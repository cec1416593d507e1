"""LLMCad's memory-budget projection of a run's summary row: per-token latency when the target's weights stream from
storage, without and with drafting overlapped with the loads (specbench/hardware/llmcad.py's model).

It lives here, not in specbench/drafters/llmcad.py, because the hardware layer sits above the drafters; its home
once wired into the summary is specbench/hardware/llmcad.py (it imports nothing else).

    python experiments/issue12_llmcad/projection.py                # Llama-2-7B on jetson, 4 GB: a grid over tau
    python experiments/issue12_llmcad/projection.py outputs/eval/RUN/summary.json   # each row's measured tau
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

import pandas as pd
from hydra import compose, initialize_config_dir

from specbench.config import CONF_DIR, build
from specbench.hardware.llmcad import streaming_latency
from specbench.hardware.roofline import ModelShape, named_shape
from specbench.hardware.spec import HardwareSpec


def project_llmcad(row: Mapping, hw: HardwareSpec, target: ModelShape, draft: ModelShape, context: float = 256,
                   dtype: str | None = None) -> dict[str, float]:
    """projected_* columns for one summary row (its tau and mean_tree_size) when hw.memory_gb, the memory budget,
    cannot hold the target's weights at the board's dtype; {} when it can. A row without drafts (autoregressive)
    gets plain streaming decoding. The draft forwards per step are taken as mean_tree_size - 1: exact for a chain,
    an upper bound for a tree (one forward can add several branches)."""
    tau, tree_size = float(row["tau"]), float(row["mean_tree_size"])
    frame = streaming_latency(target, draft, hw, hw.memory, max(tau, 1.0), max(tree_size - 1, 1.0), context, dtype)
    if frame.attrs["streamed_gb"] == 0:
        return {}
    per_token = frame["per_token_ms"].tolist()  # no budget, plain streaming, speculative, speculative + overlap
    drafted = tree_size > 1
    stream, overlap = (per_token[2], per_token[3]) if drafted else (per_token[1], per_token[1])
    return {"projected_budget_gb": frame.attrs["budget_gb"], "projected_streamed_gb": frame.attrs["streamed_gb"],
            "projected_target_calls_per_token": 1 / tau if tau > 0 else math.nan,
            "projected_ar_streaming_ms_per_token": per_token[1],
            "projected_streaming_ms_per_token": stream, "projected_overlap_ms_per_token": overlap,
            "projected_streaming_speedup": per_token[1] / stream, "projected_overlap_speedup": per_token[1] / overlap}


def _hw(overrides: list[str]) -> HardwareSpec:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return build(compose(config_name="config", overrides=overrides).hw)


def main(argv: list[str]) -> pd.DataFrame:
    """Without a file, the README's grid for assumed tau and tree sizes; with a summary.json, each row's measured
    tau and tree size. Shapes: target=NAME draft=NAME (specbench/hardware/roofline.py SHAPES; Llama-2-7B and
    TinyLlama-1.1B by default); any other key=value is a config override (hw=jetson hw.memory_gb=4 by default)."""
    files = [a for a in argv if "=" not in a]
    shapes = {"target": "llama2_7b", "draft": "tinyllama_1.1b"} | dict(
        a.split("=", 1) for a in argv if a.split("=", 1)[0] in ("target", "draft"))
    target, draft = named_shape(shapes["target"]), named_shape(shapes["draft"])
    hw = _hw([a for a in argv if "=" in a and a.split("=", 1)[0] not in shapes] or ["hw=jetson", "hw.memory_gb=4"])
    if files:
        rows = pd.read_json(files[0])[["method", "tau", "mean_tree_size"]].to_dict("records")
    else:
        rows = [{"tau": 1.0, "mean_tree_size": 1.0}] + [{"tau": tau, "mean_tree_size": size}
                                                        for size in (5, 16) for tau in (1.5, 2.0, 3.0, 4.0)]
    frame = pd.DataFrame([{**row, **project_llmcad(row, hw, target, draft)} for row in rows])
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.precision", 3):
        print(f"{shapes['target']} with a {shapes['draft']} draft on hw={hw.name}, {hw.memory} GB budget, "
              f"{hw.weight_dtype or target.dtype} weights")
        print(frame.to_string(index=False))
    return frame


if __name__ == "__main__":
    main(sys.argv[1:])
