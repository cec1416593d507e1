"""The issue's goals, read from a device run's folders (device.sh calls it):

    python3 experiments/gpu_graphs/goals.py RUN PROFILE GRAPH_OVERHEAD.json
    python3 experiments/gpu_graphs/goals.py --started RUN      (prints how many prompts the run started)

1. captured plain decoding (the run's own plain decoding, model.backend=graphs) >= 300 tok/s on an H100/H200;
2. the best lossless method >= 1.5x it (speedup_vs_own_plain: against plain decoding of the same execution);
3. the roofline's L(n) within 20% of the measured L(n) (task=profile's profile_vs_roofline.csv): as specbench prices a
   forward (hw=cuda: the measured peaks plus the per-layer fixed cost measured on eager tiny Llamas), and for the
   graphs execution also with the per-layer fixed cost measured on captured ones (graph_overhead.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from specbench.names import PLAIN, current_columns, is_plain

PLAIN_TOK_S, SPEEDUP, ROOFLINE_PCT = 300.0, 1.5, 20.0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def started(run: Path) -> int:
    """Prompts (first turns) some method of the run started: a rerun with eval.num_prompts set to it finishes the one
    a cut left half done, so that every method is summarised over the same prompts."""
    records = pd.read_json(run / "records.jsonl", lines=True)
    return int(records["question_id"].nunique())


def decoding(run: Path) -> None:
    summary = current_columns(pd.read_csv(run / "summary.csv"))  # a run written before plain decoding had one name
    columns = ["method", "backend", "dtype", "num_prompts", "tau", "mean_tree_size", "tokens_per_s",
               "speedup_vs_own_plain", "draft_ms_per_step", "verify_ms_per_step", "lossless_match"]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 2):
        print(summary[[c for c in columns if c in summary]].to_string(index=False))
    plain = summary[summary["method"] == PLAIN].iloc[0]
    eager = summary[summary["method"].str.startswith(PLAIN + "@") & (summary["backend"] == "eager")]
    gpu = summary.get("gpu_name", pd.Series(["?"])).iloc[0]
    fast = plain["tokens_per_s"] >= PLAIN_TOK_S
    print(f"\n1. captured plain decoding ({plain['backend']}/{plain['dtype']}) on {gpu}: "
          f"{plain['tokens_per_s']:.1f} tok/s (goal >= {PLAIN_TOK_S:g}): {verdict(fast)}"
          + (f"; eager plain decoding {eager['tokens_per_s'].iloc[0]:.1f} tok/s, captured "
             f"{plain['tokens_per_s'] / eager['tokens_per_s'].iloc[0]:.1f}x it" if len(eager) else ""))
    methods = summary[~summary["method"].map(is_plain) & summary["lossless_rule"].astype(bool)]
    if len(methods):
        best = methods.loc[methods["speedup_vs_own_plain"].idxmax()]
        print(f"2. best lossless method: {best['method']} {best['speedup_vs_own_plain']:.2f}x captured plain decoding "
              f"({best['tokens_per_s']:.1f} tok/s, tau {best['tau']:.2f}; goal >= {SPEEDUP:g}x): "
              f"{verdict(best['speedup_vs_own_plain'] >= SPEEDUP)}")


def roofline(profile: Path, overhead: Path) -> None:
    frame = pd.read_csv(profile / "profile_vs_roofline.csv")
    if frame.empty:  # every execution asked for was dominated by a cached one (the profile's log says which)
        print(f"\n3. roofline: {profile / 'profile_vs_roofline.csv'} has no rows")
        return
    peaks = json.loads((profile / "machine_profile.json").read_text())["peaks"]
    eager_fixed = peaks["layer_overhead_ms"]
    layers = round(((frame["roofline_ms"] - frame["bound_ms"]) / eager_fixed).median()) if eager_fixed else 0
    graph_fixed = json.loads(overhead.read_text())["layer_overhead_ms"] if overhead.exists() else None
    frame["priced_ms"] = frame["roofline_ms"]
    rows = [frame.assign(pricing=f"eager fixed cost {eager_fixed:.3f} ms/layer")]
    if graph_fixed is not None:
        graphs = frame[frame["backend"] == "graphs"]
        rows.append(graphs.assign(pricing=f"captured fixed cost {graph_fixed:.4f} ms/layer",
                                  priced_ms=graphs["bound_ms"] + layers * graph_fixed))
    table = pd.concat(rows, ignore_index=True)
    table["error_pct"] = 100 * (table["priced_ms"] - table["ms"]) / table["ms"]
    print(f"\n3. roofline L(n) against measured (ms; {layers} layers; error = (roofline - measured) / measured):")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        for (backend, pricing), group in table.groupby(["backend", "pricing"], sort=False):
            wide = group.pivot_table(index="context", columns="tokens", values=["ms", "priced_ms", "error_pct"])
            worst = group["error_pct"].abs().max()
            print(f"   {backend}, {pricing}: worst |error| {worst:.0f}% (goal <= {ROOFLINE_PCT:g}%): "
                  f"{verdict(worst <= ROOFLINE_PCT)}")
            print(wide.round(2).to_string())


def main() -> None:
    if sys.argv[1] == "--started":
        print(started(Path(sys.argv[2])))
        return
    run, profile, overhead = (Path(a) for a in sys.argv[1:4])
    if (run / "summary.csv").exists():
        decoding(run)
    else:
        print(f"no summary in {run}: the evaluation did not finish")
    if (profile / "profile_vs_roofline.csv").exists():
        roofline(profile, overhead)
    else:
        print(f"no profile_vs_roofline.csv in {profile}: task=profile did not finish")


if __name__ == "__main__":
    main()
