"""Issue 34's audit of the published checkpoint layouts: each layout, and each way a published folder can fail to be
the run's, run as a user runs it (`python run.py model=tiny_random method=... method.checkpoint=FOLDER`, in a scratch
folder), against any source tree. The folders are written by the tests' builders (tests/test_published_cli.py: the
seeds' own key names and configs, random weights for the tiny target).

    python experiments/trust/issue34_published.py                        # this checkout
    git worktree add /tmp/before_pub a045f68
    python experiments/trust/issue34_published.py --tree /tmp/before_pub # the code before issue 34's fix

Prints a Markdown row per case: how the run ended (`one line`, `uncaught error` or `exit 0`, as audit.py words it)
and, for exit 0, the method row's lossless_match and tau from summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from audit import RUN, Audit  # noqa: E402
from tests import test_published_cli as cli  # noqa: E402


def _medusa_states_more_heads(folder: Path) -> list[str]:
    return cli.medusa(folder, heads=2, stated=4)[:1] + ["tree=greedy", "tree.accept_prob=[[0.6,0.2],[0.4,0.2]]",
                                                        "tree.budget=5"]


def _medusa_tree_deeper_than_heads(folder: Path) -> list[str]:
    cli.medusa(folder)
    return ["method=medusa", "tree=static"]  # mc_sim_7b_63: 5 deep, the folder holds 3 heads


def _medusa2_of_another_model(folder: Path) -> list[str]:
    args = cli.medusa(folder, "model.safetensors")
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["model.embed_tokens.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(folder / "model.safetensors"))
    return args


def _eagle1_of_another_model(folder: Path) -> list[str]:
    args = cli.eagle1(folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["embed_tokens.weight"] = torch.randn_like(state["embed_tokens.weight"])
    torch.save(state, folder / "pytorch_model.bin")
    return args


CASES = {
    "EAGLE-1/2 layout (config.json + pytorch_model.bin, fc 2d->d + layers.*)": cli.eagle1,
    "EAGLE-3 layout (config.json + model.safetensors, fc 3d->d + midlayer.* + d2t/t2d; 8-layer target)": cli.eagle3,
    "Medusa-1 layout (medusa_lm_head.safetensors, 3 heads)": cli.medusa,
    "Medusa-2 layout (model.safetensors: the tuned model + medusa_head.*)": cli.LAYOUTS["medusa2"],
    "PPD layout (adapter_config.json + adapter_model.safetensors, 3 prompt tokens)": cli.ppd,
    **{f"EAGLE-3 {name}": make for name, (make, *_) in cli.MISMATCHES.items() if "d2t" in name},
    **{name.replace("medusa:", "Medusa:").replace("ppd:", "PPD:"): make for name, (make, *_) in cli.MISMATCHES.items()
       if "d2t" not in name},
    "Medusa: config.json states 4 heads, weights hold 2": _medusa_states_more_heads,
    "Medusa: tree=static (mc_sim_7b_63, 5 deep), 3 heads": _medusa_tree_deeper_than_heads,
    "Medusa-2: the folder's model is another model": _medusa2_of_another_model,
    "EAGLE-1: another model's token embedding": _eagle1_of_another_model,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=HERE.parents[1])
    parser.add_argument("--cases", default=":", help="a slice of the cases, e.g. 0:8 (the rest: 8:)")
    args = parser.parse_args()
    start, stop = (int(x) if x else None for x in args.cases.split(":"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.tree, capture_output=True,
                            text=True).stdout.strip()
    print(f"| case | how it ended at {commit} | method row (exit 0) |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        audit = Audit(args.tree.resolve(), Path(tmp))
        for name, make in list(CASES.items())[start:stop]:
            folder = Path(tempfile.mkdtemp(dir=tmp)) / "ckpt"
            extra = make(folder)
            code, _, err, run_dir = audit.run([*RUN, *extra, f"method.checkpoint={folder}"])
            row = ""
            if code == 0:
                method = extra[0].removeprefix("method=")
                found = {r["method"]: r for r in json.loads((run_dir / "summary.json").read_text())}.get(method)
                row = f"lossless_match {found['lossless_match']}, tau {found['tau']:.2f}" if found else "no row"
            print(f"| {name} | {audit.verdict(code, err)} | {row} |", flush=True)


if __name__ == "__main__":
    main()
