"""task=hardware: the modelled report for one hw, from named model shapes (nothing is loaded or fetched).

Prints and writes into the run folder: the projection of a paper's tau(W) onto the board, SSSD's free
verification budget b*s_q, Ghidorah's partitions with ARCA's width (boards with a CPU and a GPU on one DRAM),
LLMCad's per-token latency under a memory budget, and a roofline chart of cpu (measured), jetson, a100 and hw.

Knobs (`+hardware.KEY=VALUE`): model (llama2_7b), draft (tinyllama_1.1b), context (256), tau (mbpp: a Ghidorah
Table I row), llmcad_tau (2.5: assumed tokens per target forward), draft_len (4).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from specbench.config import CONF_DIR, build
from specbench.errors import SpecbenchError
from specbench.hardware.measured import with_measurements
from specbench.hardware.modelled import ghidorah, llmcad, plots
from specbench.hardware.modelled.ops import op_costs, roofs
from specbench.hardware.modelled.roofline import project, sssd_free_budget
from specbench.hardware.modelled.spec import HardwareSpec
from specbench.models.shape import BYTES_PER, named_shape
from specbench.reporting.paper_table import report_after_run
from specbench.tasks._common import build_hw, run_dir
from specbench.tasks.report import command_line

HW_DIR = CONF_DIR / "hw"
DEFAULTS = {"model": "llama2_7b", "draft": "tinyllama_1.1b", "context": 256, "tau": "mbpp",
            "llmcad_tau": 2.5, "draft_len": 4}


def load_hw(name: str) -> HardwareSpec:
    path = HW_DIR / f"{name}.yaml"
    if not path.exists():
        valid = ", ".join(sorted(p.stem for p in HW_DIR.glob("*.yaml")))
        raise SpecbenchError(f"hw '{name}' is unknown; valid: {valid}")
    return with_measurements(build(OmegaConf.load(path)))


def _local_dtype(cfg, hw: HardwareSpec) -> str:
    """eval.dtype when it names one; otherwise (auto) the dtype with the highest measured matmul peak."""
    peaks = hw.figure("peak_tflops")
    return cfg.eval.dtype if cfg.eval.dtype in BYTES_PER else max(peaks, key=peaks.get)


def _print(title: str, frame: pd.DataFrame) -> None:
    print(f"\n== {title}")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 3):
        print(frame.to_string(index=False))


def run(cfg) -> dict:
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    opts = {**DEFAULTS, **OmegaConf.to_container(cfg.get("hardware") or OmegaConf.create({}))}
    unknown = set(opts) - set(DEFAULTS)
    if unknown:
        raise SpecbenchError(f"hardware.{sorted(unknown)[0]} is unknown; valid: {', '.join(DEFAULTS)}")
    if opts["tau"] not in ghidorah.GHIDORAH_TAU:
        raise SpecbenchError(f"hardware.tau='{opts['tau']}' is unknown; valid: {', '.join(ghidorah.GHIDORAH_TAU)}")
    hw = build_hw(cfg)
    model, ctx = named_shape(opts["model"]), opts["context"]
    local = _local_dtype(cfg, hw)
    if hw.weight_dtype is None:  # the machine at hand runs the run's dtype
        model = model.with_dtype(local)
    tau = ghidorah.GHIDORAH_TAU[opts["tau"]]
    tables = {}

    proj = pd.DataFrame([{"width": w, "tau": t, **project(model, hw, t, w, ctx)} for w, t in tau.items()])
    tables["projection"] = proj
    _print(f"Projected on {hw.name} (PROJECTED, roofline): {opts['model']}, context {ctx}, tau(W) from Ghidorah "
           f"Table I ({opts['tau']})", proj)

    budget = sssd_free_budget(model, hw)
    tables["sssd"] = pd.DataFrame([budget])
    _print(f"SSSD free verification budget b*s_q on {hw.name} ({opts['model']}, {budget['dtype']})", tables["sssd"])
    rows = np.unique(np.round(np.logspace(0, 11, 89, base=2)))
    cost = [op_costs(model, r, ctx, 1, budget["dtype"]).set_index("op").loc[["qkv_proj", "o_proj", "mlp"]]
            for r in rows]
    peak, bw = roofs(hw, budget["dtype"])
    seconds = [float(np.maximum(c["flops"] / peak, c["bytes"] / bw).sum()) for c in cost]
    curve = pd.DataFrame({"hw": hw.name, "rows": rows, "relative_cost": np.array(seconds) / seconds[0]})
    plots.sssd_chart(curve, {hw.name: budget["qkvo"]}, f"SSSD free verification budget on {hw.name}: linear layers "
                     f"of {opts['model']} ({budget['dtype']})\ndotted line = Q/K/V/O threshold b*s_q* "
                     f"(Sec. 3.2 formula)",
                     out / "sssd_threshold.png")

    if hw.unified_memory and len(hw.units) >= 2:
        sweep = ghidorah.arca_search(model, hw, tau, ctx)
        split = ghidorah.speedup_split(sweep)
        tables["ghidorah_sweep"], tables["ghidorah"] = sweep, split
        _print(f"Ghidorah on {hw.name}, simulated: ARCA sweep", sweep)
        _print("Ghidorah: best width per partition, speedup = algorithmic x verify_cost x parallel", split)
        plots.ghidorah_chart(sweep, f"Ghidorah simulated on {hw.name}: {opts['model']} ({budget['dtype']}) + 4 "
                             f"Medusa heads, context {ctx}, tau(W) from Table I ({opts['tau']})",
                             out / "ghidorah_widths.png")

    stream = llmcad.streaming_latency(model, named_shape(opts["draft"]), hw, opts["llmcad_tau"],
                                      opts["draft_len"], ctx)
    tables["llmcad"] = stream
    a = stream.attrs
    _print(f"LLMCad on {hw.name}, modelled: {opts['model']} ({a['target_gb']:.1f} GB {a['dtype']}) with draft "
           f"{opts['draft']} ({a['draft_gb']:.1f} GB) in hw.memory_gb={a['memory_gb']:.1f} GB: {a['streamed_gb']:.1f} GB "
           f"streamed per target forward at {hw.storage_bandwidth_gbs} GB/s ({a['load_ms']:.0f} ms); "
           f"tau={opts['llmcad_tau']}, draft_len={opts['draft_len']}", stream)

    cpu = load_hw("cpu")
    specs = [(cpu, _local_dtype(cfg, cpu)), (load_hw("jetson"), None), (load_hw("a100"), None)]
    if hw.name not in ("cpu", "jetson", "a100"):
        specs.append((hw, None))
    plots.roofline_chart(specs, model, opts["model"], out / "roofline.png", context=ctx)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    print(f"\nrun folder: {out}")
    report_after_run(cfg.get("report"), out, command_line(cfg))
    return tables
