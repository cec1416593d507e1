"""The hardware report's figures: measured vs modelled L(n), the roofline chart, Ghidorah's width sweep."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specbench.hardware.modelled.ops import board_dtype, op_costs, roofs  # noqa: E402
from specbench.hardware.modelled.spec import HardwareSpec  # noqa: E402
from specbench.models.shape import ModelShape


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def profile_vs_roofline(frame: pd.DataFrame, title: str, path: Path) -> Path:
    """Measured L(n) per execution against the roofline (dashed) of its weights' bytes and its bound without the
    per-layer fixed cost (dotted), one panel per context; frame from machine_profile.roofline_error. Colour: what the
    roofline prices (the dtype, or a quantised format's bytes); marker: the backend; a quantised format's lines are
    solid in its fastest activations' dtype (bfloat16) and dash-dotted in the others."""
    contexts = sorted(frame["context"].unique())
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.6 * len(contexts), 5.6), sharey=True, squeeze=False)
    frame = frame.assign(roofline_dtype=frame["roofline_dtype"] if "roofline_dtype" in frame else frame["dtype"],
                         weights=frame["weights"] if "weights" in frame else "fp",
                         backend=frame["backend"] if "backend" in frame else "eager")
    roofs = list(dict.fromkeys(frame["roofline_dtype"]))
    markers = dict(zip(dict.fromkeys(frame["backend"]), "osD^v"))
    for ax, context in zip(axes[0], contexts):
        at = frame[frame["context"] == context]
        for i, roof_dtype in enumerate(roofs):
            rows = at[at["roofline_dtype"] == roof_dtype]
            for (backend, dtype, weights), grp in rows.groupby(["backend", "dtype", "weights"], sort=False):
                quantised = weights != "fp"
                ax.plot(grp["tokens"], grp["ms"], marker=markers[backend], color=f"C{i}",
                        linestyle="-." if quantised and dtype != "bfloat16" else "-",
                        label=f"{backend} {weights} weights, {dtype} activations" if quantised else f"{backend} {dtype}")
            roof = rows.drop_duplicates("tokens").sort_values("tokens")
            ax.plot(roof["tokens"], roof["roofline_ms"], linestyle="--", color=f"C{i}", label=f"roofline {roof_dtype}")
            if "bound_ms" in roof:
                ax.plot(roof["tokens"], roof["bound_ms"], linestyle=":", color=f"C{i}",
                        label=f"bound {roof_dtype} (no per-layer fixed cost)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens n in one forward (tree size)")
        ax.set_title(f"context {context} tokens", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("latency L(n) per forward (ms, log scale)")
    fig.suptitle(title, fontsize=9)
    axes[0][0].legend(fontsize=7, ncol=min(len(roofs), 3), loc="upper left", bbox_to_anchor=(0.0, -0.13))
    return _save(fig, path)


def roofline_chart(specs: list[tuple[HardwareSpec, str | None]], shape: ModelShape, model: str, path: Path,
                   context: int = 256, widths=(1, 2, 4, 8, 16, 32, 64)) -> Path:
    """Arithmetic intensity against attainable FLOP/s per (hw, dtype; None: the board's own), with the whole
    verify forward at each width marked."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    x = np.logspace(-1, 3, 200)
    for i, (hw, dtype) in enumerate(specs):
        dtype = board_dtype(shape, hw, dtype)
        peak, bw = roofs(hw, dtype)
        color = f"C{i}"
        name = f"{hw.name}, measured" if hw.peak_tflops == "measured" else hw.name
        ax.plot(x, np.minimum(peak, bw * x) / 1e12, color=color, label=f"{name} ({dtype}): "
                f"{peak / 1e12:.3g} TFLOP/s, {bw / 1e9:.4g} GB/s")
        pts = [op_costs(shape, n, context, 1, dtype)[["flops", "bytes"]].sum() for n in widths]
        ai = np.array([p["flops"] / p["bytes"] for p in pts])
        ax.scatter(ai, np.minimum(peak, bw * ai) / 1e12, color=color, zorder=3, s=18)
        for n, a in zip(widths, ai):
            ax.annotate(str(n), (a, min(peak, bw * a) / 1e12), textcoords="offset points", xytext=(2, -9),
                        fontsize=7, color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"Roofline: one verify forward of {model} at context {context}\n"
                 f"points = verification width n (tokens per forward)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def ghidorah_chart(sweep: pd.DataFrame, title: str, path: Path) -> Path:
    """Per partition: step time T(W) and throughput tau(W)/T(W) against the verification width, best W starred."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (partition, grp) in enumerate(sweep.groupby("partition", sort=False)):
        left.plot(grp["width"], grp["step_ms"], marker="o", color=f"C{i}", label=partition)
        right.plot(grp["width"], grp["tokens_per_s"], marker="o", color=f"C{i}", label=partition)
        best = grp.loc[grp["tokens_per_s"].idxmax()]
        right.scatter([best["width"]], [best["tokens_per_s"]], marker="*", s=200, color=f"C{i}", zorder=3)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("verification width W (tokens per step)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("modelled step time T(W) (ms)")
    right.set_ylabel("tau(W) / T(W) (tokens/s), star = ARCA's W*")
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def sssd_chart(curve: pd.DataFrame, thresholds: dict, title: str, path: Path) -> Path:
    """Relative forward cost T(b*s_q) / T(1) against b*s_q per hw, each threshold marked."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (hw, grp) in enumerate(curve.groupby("hw", sort=False)):
        ax.plot(grp["rows"], grp["relative_cost"], color=f"C{i}", label=f"{hw}: b*s_q* = {thresholds[hw]:.0f}")
        ax.axvline(thresholds[hw], color=f"C{i}", linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("b * s_q (query rows per forward, all sequences)")
    ax.set_ylabel("linear layers' cost relative to b*s_q = 1")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
