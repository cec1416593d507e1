"""A static tree: an explicit list of paths in Medusa's `medusa_choices` format, inline or from a named preset.

Each path lists 0-based ranks, one per depth: [0, 2] is the draft's top-1 token followed by the third-best token
after it. The tree's shape is fixed; its tokens come from the drafter at every step. When the drafter samples, the
rank-i child is the i-th draw without replacement, so rejection sampling can correct siblings in rank order.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from omegaconf import ListConfig, OmegaConf

from specbench.config import CONF_DIR
from specbench.errors import SpecbenchError
from specbench.trees.policy import DraftExpander, GrowingTree, TreePolicy, draw_children
from specbench.trees.token_tree import TokenTree

PRESET_DIR = CONF_DIR / "tree" / "presets"

RankPath = tuple[int, ...]  # ranks from the root, one per depth


def validate_choices(choices) -> list[RankPath]:
    """The paths sorted by (depth, ranks) -- parents before children, siblings in rank order -- or a clear error."""
    if not isinstance(choices, (list, tuple)) or len(choices) == 0:
        raise SpecbenchError(f"tree.choices={choices!r} is invalid: give a non-empty list of paths such as "
                             f"[[0], [1], [0, 0]]")
    paths: set[RankPath] = set()
    for i, path in enumerate(choices):
        ok = isinstance(path, (list, tuple)) and len(path) > 0 and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path)
        if not ok:
            raise SpecbenchError(f"tree.choices path #{i} = {path!r} is invalid: each path is a non-empty list of "
                                 f"ranks >= 0, e.g. [0, 1]")
        if tuple(path) in paths:
            raise SpecbenchError(f"tree.choices lists path {list(path)} twice; each path may appear once")
        paths.add(tuple(path))
    for path in paths:
        if len(path) > 1 and path[:-1] not in paths:
            raise SpecbenchError(f"tree.choices path {list(path)} has no parent: add its prefix {list(path[:-1])}")
    return sorted(paths, key=lambda p: (len(p), p))


def load_preset(name: str) -> list[list[int]]:
    """A preset name (a JSON file in conf/tree/presets) or a path to such a JSON file."""
    path = Path(name).expanduser()
    if not path.exists():
        path = PRESET_DIR / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in PRESET_DIR.glob("*.json") if not p.stem.endswith("_accuracies"))
        raise SpecbenchError(f"tree.preset='{name}' is neither a file nor a known preset; presets: {', '.join(known)}")
    return json.loads(path.read_text())


def cartesian_choices(widths: list[int]) -> list[list[int]]:
    """Medusa's dense tree: every top-widths[0] token, each followed by every top-widths[1] token, and so on."""
    if not widths or any(w < 1 for w in widths):
        raise SpecbenchError(f"cartesian widths {widths} are invalid: give one width >= 1 per depth")
    return [list(p) for d in range(1, len(widths) + 1) for p in itertools.product(*(range(w) for w in widths[:d]))]


class StaticPolicy(TreePolicy):
    name = "static"

    def __init__(self, choices: list[list[int]] | None = None, preset: str | None = None,
                 budget: int | None = None) -> None:
        """budget=None keeps every path; a budget keeps the first budget - 1 in (depth, ranks) order, which stays
        closed under ancestors."""
        if (choices is None) == (preset is None):
            raise SpecbenchError("tree=static needs exactly one of tree.choices (a list of paths) or tree.preset "
                                 "(a preset name or JSON file)")
        paths = validate_choices(load_preset(preset) if preset is not None else _plain(choices))
        if budget is not None and budget - 1 > len(paths):
            raise SpecbenchError(f"tree.budget={budget} is larger than the static tree's {len(paths) + 1} nodes; "
                                 f"use tree.budget<={len(paths) + 1} or null (the whole tree)")
        super().__init__(len(paths) + 1 if budget is None else budget)
        self.paths = paths = paths[: self.budget - 1]
        self.children: dict[RankPath, list[int]] = {}
        for path in paths:
            self.children.setdefault(path[:-1], []).append(path[-1])
        self.depth = max(len(p) for p in paths)

    def __len__(self) -> int:
        """Nodes of the full tree, root included (its budget)."""
        return self.budget

    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        generator = getattr(expander, "generator", None)
        tree = GrowingTree.rooted(root)
        node_of: dict[RankPath, int] = {(): 0}
        for depth in range(self.depth):
            parents = [p for p in self.children if len(p) == depth and p in node_of]
            if not parents:
                break
            parents.sort()
            rows = expander.expand(tree, [node_of[p] for p in parents])
            for parent, probs in zip(parents, rows):
                ranks = self.children[parent]
                picked = draw_children(probs, max(ranks) + 1, generator)
                if ranks == list(range(len(ranks))):  # children are the first draws: rejection can use q here
                    tree.dists[node_of[parent]] = probs
                for rank in ranks:
                    if rank < len(picked):
                        token = picked[rank]
                        node_of[parent + (rank,)] = tree.add(node_of[parent], token,
                                                             float(probs[token].clamp_min(1e-30).log()))
        return tree.freeze(with_dists=generator is not None)


def _plain(choices):
    """Hydra hands lists over as ListConfig: plain lists of ints validate the same way inline or from Python."""
    return OmegaConf.to_container(choices) if isinstance(choices, ListConfig) else choices
