"""The standard plots: PNG and PDF, a title and a caption that say what they show, every method's label legible with 12
methods, per-category and budget values that follow from the records and settings."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from specbench.reporting import plots

PROV = {"model": "smollm2_135m", "hw": "jetson", "dtype": "bfloat16", "dataset": "mt_bench", "cpu_capability": "AVX2"}
FAMILIES = {"medusa": (8, 16, 32), "ppd": (8, 16, 32), "draft_model": (8, 16), "sssd": (8, 16), "pld": (11,),
            "lookahead": (24,)}  # 12 methods beside plain decoding
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def twelve_methods(seed=0):
    """Records, summary, settings and latency profile of a run with plain decoding and 12 methods."""
    rng = np.random.default_rng(seed)
    entries = [("plain", "plain", None)] + [
        (f"{m}-{b}" if len(bs) > 1 else m, m, b) for m, bs in FAMILIES.items() for b in bs]
    records, rows = [], []
    for label, name, budget in entries:
        for c, cat in enumerate(CATEGORIES):
            for q in range(2):
                acc = rng.integers(1, 2 if budget is None else 5, size=10).tolist()
                records.append({"method": label, "question_id": f"{c}{q}", "turn": 0, "category": cat,
                                "new_tokens": 1 + sum(acc), "steps": len(acc), "wall_time": float(rng.uniform(0.5, 1.5)),
                                "accept_lengths": acc, **PROV})
        s = float(rng.uniform(0.7, 1.7)) if budget else 1.0
        rows.append({"method": label, "num_prompts": 2 * len(CATEGORIES), "tau": float(rng.uniform(1, 2)),
                     "speedup": s, "speedup_ci_low": s - 0.1, "speedup_ci_high": s + 0.1,
                     "per_depth_acceptance": json.dumps(sorted(rng.uniform(0.1, 0.8, 3).tolist(), reverse=True)),
                     "drafter_mb": float(rng.uniform(0, 50)), "kv_peak_mb": float(rng.uniform(3, 6)),
                     "peak_alloc_mb": float(rng.uniform(8, 20)), **PROV})
    summary = pd.DataFrame(rows)
    summary["method_mem_mb"] = summary["drafter_mb"] + summary["peak_alloc_mb"]
    settings = {"methods": {label: {"method": {"name": name}, **({"tree": {"budget": b}} if b else {})}
                            for label, name, b in entries}}
    profile = pd.DataFrame({"tokens": [1, 2, 4, 8], "ms": [8.0, 8.2, 8.5, 9.0], "roofline_ms": [1.1, 1.1, 1.2, 1.3]})
    return pd.DataFrame(records), summary, settings, profile


@pytest.fixture(scope="module")
def run():
    return twelve_methods()


def labels_of(fig):
    """Every label a reader sees: tick labels, legend entries and titles."""
    out = set()
    for ax in fig.axes:
        out |= {t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels()}
        if ax.get_legend():
            out |= {t.get_text() for t in ax.get_legend().get_texts()}
    return out


@pytest.mark.slow
def test_a_run_writes_every_plot_as_png_and_pdf(run, tmp_path):
    records, summary, settings, profile = run
    pngs = plots.save_plots(records, summary, tmp_path, profile, settings)
    assert {p.stem for p in pngs} == {"speed", "speed_vs_budget", "per_category", "per_depth_acceptance",
                                      "latency_profile", "memory", "accept_lengths"}
    for png in pngs:
        assert png.read_bytes()[:4] == b"\x89PNG" and png.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.slow
def test_the_budget_comes_from_the_run_folders_settings(run, tmp_path):
    records, summary, settings, profile = run
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    assert "speed_vs_budget" in {p.stem for p in plots.save_plots(records, summary, tmp_path / "plots")}
    # a run whose methods each ran at one budget gets no plot against the budget
    one = summary[summary["method"].isin(["plain", "pld", "medusa-8", "ppd-16"])]
    assert "speed_vs_budget" not in {p.stem for p in plots.save_plots(records, one, tmp_path / "one", None, settings)}
    table = plots.with_budgets(summary, settings).set_index("method")
    assert table.loc["medusa-16", "tree_budget"] == 16 and table.loc["medusa-16", "method_name"] == "medusa"
    assert np.isnan(table.loc["plain", "tree_budget"])


def test_a_tree_sized_per_step_is_its_own_line_at_its_mean_size():
    """SSSD's sized tree is capped by tree.budget, not drafted at it: plotted at the budget, on the fixed trees'
    line, it would read as a point of that curve."""
    summary = pd.DataFrame({"method": ["plain", "sssd-3", "sssd-sized-4"], "mean_tree_size": [1.0, 3.0, 1.93]})
    sssd = {"method": {"name": "sssd", "drafter": {"sized": False}}, "tree": {"budget": 3}}
    settings = {"methods": {"plain": {"method": {"name": "plain"}}, "sssd-3": sssd,
                            "sssd-sized-4": {"method": {"name": "sssd", "drafter": {"sized": True}},
                                             "tree": {"budget": 4}}}}
    table = plots.with_budgets(summary, settings).set_index("method")
    assert table.loc["sssd-3", "tree_budget"] == 3 and table.loc["sssd-3", "method_name"] == "sssd"
    assert table.loc["sssd-sized-4", "tree_budget"] == 1.9
    assert table.loc["sssd-sized-4", "method_name"] == "sssd (sized per step)"


def test_every_figure_has_a_title_axis_units_and_the_caption(run):
    records, summary, settings, profile = run
    table = plots.with_budgets(summary, settings)
    figures = [plots.speed_figure(summary), plots.budget_figure(table), plots.category_figure(records, summary),
               plots.per_depth_figure(summary), plots.latency_figure(profile, summary), plots.memory_figure(table),
               plots.accept_lengths_figure(records, summary)]
    for fig in figures:
        assert fig._suptitle.get_text()
        caption = " ".join(t.get_text() for t in fig.texts)
        for word in ("smollm2_135m", "hw jetson", "bfloat16", "mt_bench", "16 prompts"):
            assert word in caption, (fig._suptitle.get_text(), word)
        for ax in fig.axes:
            if ax.get_visible() and ax.get_xlabel():  # shared axes label their outer panels only
                assert "(" in ax.get_xlabel() or "per" in ax.get_xlabel() or "depth" in ax.get_xlabel()
        assert any(ax.get_xlabel() for ax in fig.axes) and any(ax.get_ylabel() or ax.get_yticklabels()
                                                                for ax in fig.axes)
        plots.plt.close(fig)


def test_all_twelve_methods_are_labelled_and_told_apart(run):
    records, summary, settings, _ = run
    methods = [m for m in summary["method"] if m != "plain"]
    assert len(methods) == 12
    for fig in (plots.speed_figure(summary), plots.category_figure(records, summary),
                plots.per_depth_figure(summary), plots.memory_figure(plots.with_budgets(summary, settings)),
                plots.accept_lengths_figure(records, summary)):
        assert set(methods) <= labels_of(fig), fig._suptitle.get_text()
        plots.plt.close(fig)
    fig = plots.per_depth_figure(summary)
    lines = fig.axes[0].get_lines()
    assert len({(line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color()),
                 line.get_marker()) for line in lines}) == len(lines) == 13  # no two methods look alike
    plots.plt.close(fig)


def test_per_category_bars_are_the_ratio_of_tokens_per_second(tmp_path):
    rows = [("plain", "math", 10, 1.0), ("pld", "math", 10, 0.5), ("plain", "coding", 10, 1.0),
            ("pld", "coding", 30, 1.0)]
    records = pd.DataFrame([{"method": m, "category": c, "new_tokens": n, "wall_time": t, "steps": n,
                             "question_id": "q", "turn": 0} for m, c, n, t in rows])
    summary = pd.DataFrame({"method": ["plain", "pld"], "num_prompts": 2, **PROV})
    fig = plots.category_figure(records, summary)
    widths = {ax.get_title().split(" (")[0]: ax.patches[0].get_width() for ax in fig.axes if ax.get_visible()}
    assert widths == pytest.approx({"math": 2.0, "coding": 3.0})
    plots.plt.close(fig)


def test_a_sweep_plots_each_method_and_dataset_against_the_swept_budget(tmp_path):
    frames = []
    for budget in ("4", "8", "16"):  # sweep.py reads swept values from overrides.yaml as strings
        for dataset in ("mt_bench", "humaneval"):
            _, summary, _, _ = twelve_methods(seed=int(budget))
            frames.append(summary.assign(dataset=dataset, **{"tree.budget": budget}))
    table = pd.concat(frames, ignore_index=True)
    pngs = plots.save_sweep_plots(table, tmp_path, "tree.budget", ["dataset"])
    assert [p.name for p in pngs] == ["sweep.png", "sweep_memory.png"]
    assert all(p.with_suffix(".pdf").exists() for p in pngs)
    fig = plots.budget_figure(table.assign(**{"tree.budget": pd.to_numeric(table["tree.budget"]),
                                              "method_name": table["method"]}), "tree.budget", "method")
    legend = {t.get_text() for t in fig.axes[1].get_legend().get_texts()}
    assert len(legend) == 12 and "plain" not in legend  # plain decoding is the line at 1, not a method
    assert sorted(fig.axes[0].get_xticks()) == [4, 8, 16]
    plots.plt.close(fig)


def test_the_speedup_axis_names_the_fastest_plain_decodings_weights():
    """A quantised target is an execution of its own: 'compile/bfloat16' alone would name the float model."""
    table = pd.DataFrame({"method": ["plain", "pld"], "fastest_plain": ["plain"] * 2,
                          "backend": ["compile"] * 2, "dtype": ["bfloat16"] * 2, "weights": ["int4_g32"] * 2,
                          "speedup": [1.0, 0.9], "tau": [1.0, 1.3]})
    assert plots._fastest(table) == "plain, compile/bfloat16/int4_g32"
    assert plots._fastest(table.assign(weights="fp")) == "plain, compile/bfloat16"
    assert plots._fastest(table.drop(columns="weights")) == "plain, compile/bfloat16"  # older summaries
    named = table.assign(method=["plain@openvino/float32/w4a8_g64", "pld"],
                         fastest_plain=["plain@openvino/float32/w4a8_g64"] * 2)
    assert plots._fastest(named) == "plain@openvino/float32/w4a8_g64"  # its label names it once


def test_the_caption_names_no_dtype_an_engine_row_does_not_have():
    summary = pd.DataFrame({"model": ["m", "m"], "hw": ["cpu", "cpu"], "backend": ["eager", "openvino"],
                            "dtype": ["float32", np.nan], "weights": ["fp", "int4_g64"], "dataset": ["d", "d"],
                            "num_prompts": [20, 20]})
    text = plots.caption(summary)
    assert "| eager, openvino | float32 | weights fp, int4_g64 |" in text and "nan" not in text


def test_the_speed_plot_marks_a_method_whose_promised_equal_answers_were_not(run):
    """A method that matched its reference on 10 of 16 prompts (a route whose rows differ on this CPU) is hatched and
    labelled so; one that matched all of them, one whose rule promises nothing (NaN) and plain decoding are not."""
    _, summary, _, _ = run
    summary = summary.assign(lossless_match=[math.nan if m == "plain" else 1.0 for m in summary["method"]])
    summary.loc[summary["method"] == "sssd-8", "lossless_match"] = 10 / 16
    summary.loc[summary["method"] == "pld", "lossless_match"] = math.nan
    fig = plots.speed_figure(summary)
    assert "sssd-8\n(not lossless: 10/16)" in labels_of(fig)
    assert not any("not lossless" in label for label in labels_of(fig) - {"sssd-8\n(not lossless: 10/16)"})
    for ax in fig.axes:
        hatched = [bar.get_hatch() for bar in ax.patches]
        assert hatched[list(summary["method"]).index("sssd-8")] == "///" and hatched.count("///") == 1
    plots.plt.close(fig)
