"""How far one evaluation walks through the code: a tiny run (model=tiny_random, method=pld, 2 prompts x 8 tokens)
traced with sys.setprofile. The config's walk: the specbench functions handed the run's config (an argument that is an
OmegaConf DictConfig; places), the modules they live in (rooms), and the calls between two of them from a module of a
lower layer into one of a higher (climbs back up; the layers are pyproject.toml's import-linter contract, whose imports
only point down). The same three counts for every specbench function the run enters are printed beside them.

    python experiments/house/walk.py [--out experiments/house/walk.csv]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layers() -> dict[str, int]:
    """Package or module -> its layer's depth (0: the top), from the import-linter contract."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return {name.strip(): depth for depth, layer in enumerate(contract["layers"]) for name in layer.split("|")}


def depth_of(module: str, table: dict[str, int]) -> int | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in table:
            return table[".".join(parts[:i])]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true")
    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from specbench.config import CONF_DIR
    from specbench.tasks import dispatch

    from omegaconf import DictConfig

    table = layers()
    walks = {kind: (Counter(), Counter()) for kind in ("config", "all")}  # kind -> (places, climbs)
    stack: list[tuple[str, bool]] = []  # (module, handed the config) of each frame entered

    def profile(frame, event, _arg):
        if event == "call":
            module, code = frame.f_globals.get("__name__", ""), frame.f_code
            args = [frame.f_locals.get(v) for v in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
            config = module.startswith("specbench") and any(isinstance(a, DictConfig) for a in args)
            for kind, (places, climbs) in walks.items():
                if not module.startswith("specbench") or (kind == "config" and not config):
                    continue
                places[(module, code.co_qualname)] += 1
                caller = next((m for m, c in reversed(stack) if m.startswith("specbench") and (c or kind == "all")),
                              None)
                if caller and caller != module:
                    up, down = depth_of(module, table), depth_of(caller, table)
                    if up is not None and down is not None and up < down:
                        climbs[(caller, module, code.co_qualname)] += 1
            stack.append((module, config))
        elif event == "return" and stack:
            stack.pop()

    with tempfile.TemporaryDirectory() as out, initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config",
                      overrides=["model=tiny_random", "method=pld", "eval.dtype=float32", "eval.num_prompts=2",
                                 "eval.max_new_tokens=8", "eval.warmup=0", "eval.memory_probe=false",
                                 "eval.latency_profile=false", "eval.fastest_plain=false", "eval.engines=[]", "~logger",
                                 f"run_dir={out}"])
        sys.setprofile(profile)
        try:
            dispatch(cfg)
        finally:
            sys.setprofile(None)
    for kind, (places, climbs) in walks.items():
        rooms = {module for module, _ in places}
        print(f"{kind}: {len(places)} places in {len(rooms)} rooms, climbing back up {len(climbs)} times")
    for (caller, module, name), n in sorted(walks["config"][1].items()):
        print(f"  config climbs {caller} -> {module}.{name} ({n}x)")
    if args.out:
        import pandas as pd

        pd.DataFrame([{"walk": kind, "module": m, "function": f, "calls": n} for kind, (places, _) in walks.items()
                      for (m, f), n in sorted(places.items())]).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
