"""The standard plots of a run or a sweep, drawn with matplotlib from the records and summary tables.

Every plot carries a title, axes with units and a caption line with the model, hw, dtype, dataset and prompt count
(read from the summary's provenance columns), so a figure found on its own still says what it shows. Each is saved
as PNG (for loggers and READMEs) and PDF (for papers). Methods keep one colour and marker across a run's plots, and
labels sit on horizontal bars or in a legend outside the axes, so 12 methods stay legible.

Builders return a Figure (`*_figure`) so tests and the notebook can inspect or show it; `save_plots` (a run) and
`save_sweep_plots` (a multirun) write them.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs are headless
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from specbench.execution.value import Execution  # noqa: E402
from specbench.names import PLAIN, is_plain  # noqa: E402

# 12 colours told apart in print (tab10 but its grey, which marks plain decoding, and three more), each paired
# with its own marker
COLORS = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7] + ["#000000", "#8c6d31", "#393b79"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p"]
FORMATS = ("png", "pdf")
SPEEDUP_LABEL = "speedup (x), ratio of means, 95% CI,\nover the fastest plain decoding of the same weights:\n{}"
LABEL_POINTS = 62  # the tick labels and SPEEDUP_LABEL's three lines, from the axes down


def style(i: int) -> dict:
    """The i-th method's colour and marker; past 12 the colours repeat with other markers."""
    return {"color": COLORS[i % len(COLORS)], "marker": MARKERS[(i + i // len(COLORS)) % len(MARKERS)]}


def method_styles(labels) -> dict[str, dict]:
    """Each label's style, the same in every plot of a run: plain decoding grey, the others in order."""
    labels = list(dict.fromkeys(labels))
    drafting = [m for m in labels if not is_plain(m)]
    return {m: {"color": "grey", "marker": "x"} if is_plain(m) else style(drafting.index(m)) for m in labels}


def caption(summary: pd.DataFrame) -> str:
    def one(key):  # an engine's row has no dtype of ours: left out rather than printed as nan
        return ", ".join(str(v) for v in dict.fromkeys(summary[key].dropna())) if key in summary else "?"
    return (f"{one('model')} | hw {one('hw')} | {one('backend')} | {one('dtype')} | weights {one('weights')} | "
            f"{one('dataset')} | "
            f"{int(summary['num_prompts'].max())} prompts | {_device(summary, one)}")


def _device(summary: pd.DataFrame, one) -> str:
    """The GPU where the run had one, else the CPU's vector ISA (what decides a CPU run's speed)."""
    return one("gpu_name") if "gpu_name" in summary and summary["gpu_name"].notna().any() else one("cpu_capability")


def with_budgets(summary: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """The summary with each label's method_name and tree_budget (nodes per verification forward), read from the
    run's settings.json; plain decoding has no tree (NaN)."""
    methods = settings["methods"]

    def sized_per_step(label: str) -> bool:
        return bool(methods.get(label, {}).get("method", {}).get("drafter", {}).get("sized", False))

    def budget(label: str, mean_tree: float) -> float:
        """A hardware-aware tree's budget is only its cap: it is plotted at the size it chose (the mean rows), and a
        tree sized per step (method.drafter.sized) at its mean size."""
        tree = methods.get(label, {}).get("tree", {})
        if not np.isfinite(mean_tree):
            return tree.get("budget", np.nan)
        if sized_per_step(label):
            return float(np.round(mean_tree, 1))
        sized = str(tree.get("_target_", "")).endswith("HardwareAwarePolicy")
        return float(np.round(mean_tree)) if sized else tree.get("budget", np.nan)

    def family(label: str) -> str:
        name = methods.get(label, {}).get("method", {}).get("name", label)
        return f"{name} (sized per step)" if sized_per_step(label) else name

    mean_tree = summary["mean_tree_size"] if "mean_tree_size" in summary else pd.Series(np.nan, index=summary.index)
    return summary.assign(method_name=[family(m) for m in summary["method"]],
                          tree_budget=[budget(m, t) for m, t in zip(summary["method"], mean_tree)])


def save_plots(records: pd.DataFrame, summary: pd.DataFrame, out_dir: str | Path,
               latency_profile: pd.DataFrame | None = None, settings: dict | None = None) -> list[Path]:
    """A run's plots in out_dir as PNG and PDF; returns the PNGs. settings: the run's settings.json (read from the
    folder above out_dir, the run folder, when not given), which gives each method its tree budget."""
    out = Path(out_dir)
    if settings is None and (out.parent / "settings.json").exists():
        settings = json.loads((out.parent / "settings.json").read_text())
    table = with_budgets(summary, settings) if settings else summary
    figures = {"speed": speed_figure(summary), "per_depth_acceptance": per_depth_figure(summary),
               "memory": memory_figure(table)}
    if len(records):
        figures["accept_lengths"] = accept_lengths_figure(records, summary)
    if several_budgets(table):
        figures["speed_vs_budget"] = budget_figure(table)
    if "category" in records and PLAIN in set(records["method"]):
        figures["per_category"] = category_figure(records, summary)
    if latency_profile is not None and not latency_profile.empty:
        figures["latency_profile"] = latency_figure(latency_profile, summary)
    if "alpha_history" in records and records["alpha_history"].notna().any():
        figures["alpha"] = alpha_figure(records, summary)
    if "pass1" in summary and summary["pass1"].notna().any():  # eval.quality: answers executed
        figures["quality_frontier"] = quality_figure(summary)
    return [save(fig, out / name)[0] for name, fig in figures.items()]


def several_budgets(table: pd.DataFrame, budget: str = "tree_budget", family: str = "method_name") -> bool:
    """Whether a method ran at several tree budgets (medusa-8, medusa-16): only then is a plot against the budget
    more than the per-method bars."""
    return budget in table and _drafting(table, budget).groupby(family)[budget].nunique().gt(1).any()


def save_sweep_plots(table: pd.DataFrame, out_dir: str | Path, key: str, by: list[str] = ()) -> list[Path]:
    """A sweep's speedup (95% CI), throughput speedup and tau, and memory, against the swept setting `key` (a
    numeric column of the sweep table: tree.budget, eval.batch_size): one line per method and per value of the
    other swept settings `by`. PNG and PDF in out_dir; returns the PNGs."""
    table = table.assign(**{key: pd.to_numeric(table[key])})
    family = table[["method", *by]].astype(str).agg(" ".join, axis=1) if by else table["method"]
    table = table.assign(family=family, method_name=table["method"])
    out = Path(out_dir)
    figures = {"sweep": budget_figure(table, key, "family", throughput="throughput_speedup" in table)}
    if "kv_peak_mb" in table:
        figures["sweep_memory"] = memory_figure(table, key, "family", bars=False)
    return [save(fig, out / name)[0] for name, fig in figures.items()]


def save(fig: Figure, stem: Path) -> list[Path]:
    """fig as stem.png and stem.pdf."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(f".{fmt}") for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths


def speed_figure(summary: pd.DataFrame) -> Figure:
    """The headline speedup (ratio of means against the fastest plain decoding) with its 95% paired bootstrap
    interval, and tau, one bar per method."""
    n = len(summary)
    fig, (ax1, ax2) = plt.subplots(1, 2, sharey=True, figsize=(10, 1.6 + 0.32 * n))
    y = np.arange(n)
    colors = [method_styles(summary["method"])[m]["color"] for m in summary["method"]]
    mean = summary["speedup"].to_numpy(dtype=float)
    err = np.vstack([mean - summary["speedup_ci_low"], summary["speedup_ci_high"] - mean]).clip(min=0)
    ax1.barh(y, mean, xerr=np.nan_to_num(err), capsize=3, color=colors)
    right = np.fmax(mean, summary["speedup_ci_high"].to_numpy(dtype=float))  # the label clears the error bar
    if "speedup_any" in summary and (summary["fastest_plain_any"] != summary["fastest_plain"]).any():
        anyw = summary["speedup_any"].to_numpy(dtype=float)
        ax1.scatter(anyw, y, marker="D", s=18, color="black", zorder=3,
                    label=f"over the fastest plain decoding\nof any weights: {_fastest(summary, 'fastest_plain_any')}")
        # under the x label's three lines, by points: an anchor in axes fractions moved with the figure's height
        # and sat on the label's last line
        below = offset_copy(ax1.transAxes, fig=fig, y=-LABEL_POINTS, units="points")
        ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below, frameon=False)
        right = np.fmax(right, anyw)
    for yi, (value, x) in enumerate(zip(mean, right)):
        if np.isfinite(value):
            ax1.text(x, yi, f"  {value:.2f}x", va="center", ha="left", fontsize=7)
    finite = right[np.isfinite(right)]  # none in a run without plain decoding (eval.plain=false): no speedup
    ax1.set_xlim(0, 1.15 * (finite.max() if finite.size else 1.0))
    ax1.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax1.set_xlabel(SPEEDUP_LABEL.format(_fastest(summary)))
    ax2.barh(y, summary["tau"], color=colors)
    ax2.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax2.set_xlabel("tau (tokens per target forward)")
    # a method whose answers its rule promised equal to its reference's, and which were not, reads as such here too,
    # not only in the printed table's lossless column: its bars hatched, its label saying how many matched
    missed = _missed_lossless(summary)
    for ax in (ax1, ax2):
        for bar, label in zip(ax.patches, missed):
            if label:
                bar.set_hatch("///")
                bar.set_alpha(0.5)
    ax1.set_yticks(y, [m if not label else f"{m}\n({label})" for m, label in zip(summary["method"], missed)])
    ax1.invert_yaxis()
    return _finish(fig, "Speedup and acceptance per method", summary)


def _missed_lossless(summary: pd.DataFrame) -> list[str]:
    """Per row, "not lossless: k/n" where a method's rule promised its answers equal to its reference's and fewer were
    (a route whose rows differ on this CPU), else "" (plain decoding of another execution only agrees or not)."""
    if "lossless_match" not in summary or "num_prompts" not in summary:
        return [""] * len(summary)
    return ["" if is_plain(method) or pd.isna(match) or match >= 1 else f"not lossless: {round(match * n)}/{n}"
            for method, match, n in zip(summary["method"], summary["lossless_match"], summary["num_prompts"])]


def budget_figure(table: pd.DataFrame, budget: str = "tree_budget", family: str = "method_name",
                  throughput: bool = False) -> Figure:
    """The headline speedup (95% CI) and tau against the tree budget (or another swept setting), one line per method
    family (medusa-8, medusa-16 and medusa-32 are one line); plain decoding is the dashed line at 1. throughput: a
    panel of the batch's tokens/s over plain decoding's too (batch sweeps)."""
    rows = _drafting(table, budget)
    panels = [(m, label) for m, label, shown in (
        ("speedup", SPEEDUP_LABEL.format(_fastest(rows)), True),  # the references of the rows drawn only
        ("throughput_speedup", "throughput over plain decoding's (x)", throughput),
        ("tau", "tau (tokens per target forward)", True)) if shown and m in table]  # old summaries lack some
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(5.5 * len(panels), 4.2))
    axes = axes[0]
    groups = list(rows.groupby(family, sort=False))
    for i, (name, grp) in enumerate(groups):
        grp = grp.sort_values(budget)
        x = grp[budget] * _dodge(i, len(groups))
        for ax, (metric, _) in zip(axes, panels):
            if metric == "speedup":
                mean = grp[metric].to_numpy(dtype=float)
                err = np.vstack([mean - grp["speedup_ci_low"], grp["speedup_ci_high"] - mean]).clip(min=0)
                ax.errorbar(x, mean, yerr=np.nan_to_num(err), capsize=3, label=name, **style(i))
            else:
                ax.plot(x, grp[metric], label=name, **style(i))
    for ax, (_, label) in zip(axes, panels):
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        _budget_axis(ax, rows[budget], budget)
        ax.set_ylabel(label)
    _legend_outside(axes[-1])
    return _finish(fig, f"Speedup and tau against the {_axis_label(budget).split(' (')[0]}", table)


def category_figure(records: pd.DataFrame, summary: pd.DataFrame) -> Figure:
    """Speedup per category: a method's tokens/s over the fastest plain decoding's on that category's prompts
    (Spec-Bench's ratio of means), tau written at each bar. One panel per category, methods in the summary's order."""
    methods = [m for m in summary["method"] if not is_plain(m)]
    reference = dict(zip(summary["method"], summary["fastest_plain"].fillna(PLAIN))) if "fastest_plain" in summary \
        else {}
    fastest = ", ".join(dict.fromkeys(reference.get(m, PLAIN) for m in methods))  # the plotted methods' own
    categories = list(dict.fromkeys(records["category"]))
    rate = records.groupby(["category", "method"])[["new_tokens", "wall_time"]].sum()
    speed = rate["new_tokens"] / rate["wall_time"]
    steps = records.groupby(["category", "method"])[["new_tokens", "steps"]].sum()
    tau = (steps["new_tokens"] - records.groupby(["category", "method"]).size()) / steps["steps"]
    cols = min(4, len(categories))
    grid = (len(categories) + cols - 1) // cols
    fig, axes = plt.subplots(grid, cols, sharey=True, squeeze=False, sharex=True,
                             figsize=(3.2 * cols + 1.5, 1.0 + grid * (1.3 + 0.25 * len(methods))))
    y = np.arange(len(methods))
    colors = [method_styles(summary["method"])[m]["color"] for m in methods]
    for ax, cat in zip(axes.flat, categories):
        ratio = [speed.get((cat, m), np.nan) / speed.get((cat, reference.get(m, PLAIN)), np.nan) for m in methods]
        ax.barh(y, ratio, color=colors)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        for yi, (r, m) in enumerate(zip(ratio, methods)):
            if np.isfinite(r):
                ax.text(r, yi, f" τ{tau.get((cat, m), np.nan):.2f}", va="center", fontsize=6)
        ax.set_title(f"{cat} ({int((records['category'] == cat).sum() / records['method'].nunique())} prompts)",
                     fontsize=8)
        ax.set_yticks(y, methods, fontsize=7)
    for ax in axes.flat[len(categories):]:
        ax.set_visible(False)
    for ax in axes[-1]:  # the references once, under the grid: in every bottom panel they ran into each other
        ax.set_xlabel("speedup (x)", fontsize=8)
    fig.supxlabel(f"over the fastest plain decoding of the same weights: {fastest}", fontsize=8)
    axes[0, 0].invert_yaxis()
    return _finish(fig, "Speedup per category (tokens/s over the same weights' fastest plain decoding's, τ at each bar)",
                   summary)


def per_depth_figure(summary: pd.DataFrame) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    styles = method_styles(summary["method"])
    for _, row in summary.iterrows():
        rates = row["per_depth_acceptance"]
        rates = json.loads(rates) if isinstance(rates, str) else rates
        if len(rates):
            ax.plot(range(1, len(rates) + 1), rates, label=row["method"], **styles[row["method"]])
    ax.set_xlabel("draft depth d (tokens past the root)")
    ax.set_ylabel("P(depth d accepted | d-1 accepted, it had children)")
    ax.set_ylim(0, 1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend_outside(ax)
    return _finish(fig, "Acceptance by draft depth", summary)


def accept_lengths_figure(records: pd.DataFrame, summary: pd.DataFrame) -> Figure:
    """Share of steps that gained k tokens, one line per method (overlaid histograms hide each other)."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    styles = method_styles([*summary["method"], *records["method"]])
    for method, grp in records.groupby("method", sort=False):
        lengths = np.concatenate([np.asarray(a, dtype=int) for a in grp["accept_lengths"]])
        if lengths.size:
            k = np.arange(1, lengths.max() + 1)
            share = np.bincount(lengths, minlength=k[-1] + 1)[1:] / lengths.size
            ax.plot(k, share, label=method, **styles[method])
    ax.set_xlabel("tokens gained per verification step (bonus included)")
    ax.set_ylabel("share of steps")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend_outside(ax)
    return _finish(fig, "Tokens per verification step", summary)


def latency_figure(profile: pd.DataFrame, summary: pd.DataFrame) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(profile["tokens"], profile["ms"], marker="o", label="measured L(n) here")
    if "roofline_ms" in profile:
        ax.plot(profile["tokens"], profile["roofline_ms"], marker="s", linestyle="--",
                label=f"roofline of hw {', '.join(map(str, dict.fromkeys(summary.get('hw', ['?']))))} at the run's "
                      f"weights")
    ax.set_xscale("log", base=2)
    ax.set_xticks(profile["tokens"], [f"{t:g}" for t in profile["tokens"]])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 1.5, 2, 3, 4, 5, 7)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("tokens in one forward (n)")
    ax.set_ylabel("latency of one forward (ms, log scale)")
    ax.legend(fontsize=8)
    return _finish(fig, "Forward latency against its roofline", summary)


def memory_figure(table: pd.DataFrame, budget: str = "tree_budget", family: str = "method_name",
                  bars: bool = True) -> Figure:
    """bars: each method's memory, its drafter's weights stacked with the peak allocation while decoding (the KV
    caches at their largest marked). Beside them, when a method ran at several budgets: that total against the
    budget."""
    budgets = several_budgets(table, budget, family)
    panels = [p for p, shown in (("bars", bars), ("budget", budgets)) if shown]
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(6.5 * len(panels), 2.4 + 0.3 * (len(table) if bars else 12)))
    axes = dict(zip(panels, axes[0]))
    if bars:
        ax = axes["bars"]
        y = np.arange(len(table))
        drafter, alloc = table["drafter_mb"].to_numpy(dtype=float), table["peak_alloc_mb"].to_numpy(dtype=float)
        ax.barh(y, np.nan_to_num(drafter), color="tab:orange", label="drafter weights")
        ax.barh(y, np.nan_to_num(alloc), left=np.nan_to_num(drafter), color="tab:blue",
                label="peak allocation while decoding")
        ax.scatter(table["kv_peak_mb"], y, marker="|", s=120, color="black", zorder=3, label="KV caches at their peak")
        for row in y[np.isnan(drafter) & np.isnan(alloc) & table["kv_peak_mb"].isna().to_numpy()]:
            ax.text(0, row, " not measured (an engine allocates in its own runtime)", va="center", fontsize=7,
                    color="dimgray")
        ax.set_yticks(y, table["method"])
        ax.invert_yaxis()
        ax.set_xlabel("memory beyond the target's weights (MiB)")
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, borderaxespad=0.3,
                  title="peak allocation not measured (eval.memory_probe=false)" if np.isnan(alloc).all() else None,
                  title_fontsize=7)
    if budgets:
        ax = axes["budget"]
        measured = table["method_mem_mb"].notna().any()
        metric = "method_mem_mb" if measured else "kv_peak_mb"
        rows = _drafting(table, budget)
        for i, (name, grp) in enumerate(rows.groupby(family, sort=False)):
            grp = grp.sort_values(budget)
            ax.plot(grp[budget], grp[metric], label=name, **style(i))
        _budget_axis(ax, rows[budget], budget)
        ax.set_ylabel("drafter + peak allocation (MiB)" if measured else "KV caches at their peak (MiB)")
        _legend_outside(ax)
    against = f"against the {_axis_label(budget).split(' (')[0]}"
    return _finish(fig, "Memory " + " and ".join({"bars": "per method", "budget": against}[p] for p in panels), table)


def alpha_figure(records: pd.DataFrame, summary: pd.DataFrame) -> Figure:
    """LLMCad's verification threshold over one generation per method: the first prompt's."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    styles = method_styles([*summary["method"], *records["method"]])
    for method, grp in records[records["alpha_history"].notna()].groupby("method", sort=False):
        alpha = grp["alpha_history"].iloc[0]
        ax.step(range(1, len(alpha) + 1), alpha, where="post", label=f"{method} ({grp['question_id'].iloc[0]})",
                color=styles[method]["color"])
    ax.set_yscale("log")
    ax.set_xlabel("verification step")
    ax.set_ylabel("alpha (log scale)")
    ax.set_title("drafting stops once the best branch's confidence falls below alpha", fontsize=8)
    _legend_outside(ax)
    return _finish(fig, "LLMCad's adaptive verification threshold over one generation", summary)


def quality_figure(summary: pd.DataFrame) -> Figure:
    """The quality-speed frontier (eval.quality): each method's pass@1 (95% CI over problems) against its headline
    speedup (95% CI), greedy plain decoding's pass@1 as the band a lossless method must sit on. Lossless rules are
    hollow markers: off the band they would be a bug, where a lossy rule's distance below it is its cost."""
    rows = summary[summary["pass1"].notna()]
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    others = [m for m in rows["method"] if m != PLAIN]  # a tuned backbone's plain decoding gets its own colour
    styles = {PLAIN: {"color": "grey", "marker": "X"}} | {m: style(i) for i, m in enumerate(others)}
    greedy = rows[rows["method"] == PLAIN]
    if len(greedy):
        g = greedy.iloc[0]
        ax.axhspan(100 * g["pass1_ci_low"], 100 * g["pass1_ci_high"], color="grey", alpha=0.15, lw=0)
        ax.axhline(100 * g["pass1"], color="grey", lw=0.9, ls="--",
                   label=f"greedy ({PLAIN}) pass@1 {100 * g['pass1']:.1f}%, 95% CI band")
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    for _, row in rows.iterrows():
        x, y = float(row["speedup"]), 100 * float(row["pass1"])
        xerr = [[max(0.0, x - row["speedup_ci_low"])], [max(0.0, row["speedup_ci_high"] - x)]]
        yerr = [[max(0.0, y - 100 * row["pass1_ci_low"])], [max(0.0, 100 * row["pass1_ci_high"] - y)]]
        lossless = bool(row.get("lossless_rule", False))
        look = styles[row["method"]]
        ax.errorbar(x, y, xerr=np.nan_to_num(xerr), yerr=np.nan_to_num(yerr), capsize=3, ls="none",
                    color=look["color"], marker=look["marker"], markersize=7, mfc="white" if lossless else None,
                    label=f"{row['method']} ({'lossless' if lossless else 'lossy'}): "
                          f"{100 * row['pass1']:.1f}%, {row['speedup']:.2f}x")
    ax.set_xlabel(SPEEDUP_LABEL.format(_fastest(summary)))
    ax.set_ylabel("pass@1 on HumanEval (%, answers executed),\n95% CI over problems")
    ax.set_ylim(bottom=0)
    _legend_outside(ax)
    return _finish(fig, "Quality against speed: pass@1 by execution and speedup per method", summary)


def _fastest(table: pd.DataFrame, column: str = "fastest_plain") -> str:
    """The plain decoding every speedup in `table` is judged against (older summaries: the run's own plain decoding), with its
    execution; column fastest_plain_any: the fastest of any weights."""
    names = list(dict.fromkeys(table[column].dropna())) if column in table else []
    if (len(names) == 1 and "@" not in str(names[0]) and {"backend", "dtype"} <= set(table)
            and (table["method"] == names[0]).any()):  # plain@<execution> names its execution already
        row = table[table["method"] == names[0]].iloc[0]  # name its execution: which plain decoding was fastest
        weights = row.get("weights")  # a quantised target is an execution of its own: name its weights
        return f"{names[0]}, " + Execution(row["backend"], row["dtype"], "fp" if pd.isna(weights) else weights).label
    return ", ".join(map(str, names)) or PLAIN


def _drafting(table: pd.DataFrame, budget: str) -> pd.DataFrame:
    """The rows of methods that verify a tree: plain decoding (at any dtype) has none, whatever a sweep set."""
    return table[table[budget].notna() & ~table["method_name"].astype(str).map(is_plain)]


def _dodge(i: int, n: int) -> float:
    """A factor that shifts line i of n a little along a log axis, so error bars at one budget do not hide each
    other."""
    return 2 ** (0.04 * (i - (n - 1) / 2))


def _axis_label(key: str) -> str:
    return {"tree_budget": "tree budget (nodes per verification forward)",
            "tree.budget": "tree budget (nodes per verification forward)",
            "eval.batch_size": "batch size (sequences per verification forward)"}.get(key, key)


def _budget_axis(ax, budgets: pd.Series, key: str) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(budgets.dropna()))
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(_axis_label(key))


def _legend_outside(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _finish(fig: Figure, title: str, table: pd.DataFrame) -> Figure:
    fig.suptitle(title, fontsize=10)
    fig.text(0.5, 0.0, caption(table), ha="center", va="top", fontsize=7, color="dimgray")
    fig.tight_layout()
    return fig
