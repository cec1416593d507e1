"""Building a method's drafter from its config, and checking that the run's tree policy is one it uses."""

from __future__ import annotations

from hydra.utils import get_class

from specbench.config import build
from specbench.drafters.base import Drafter
from specbench.errors import SpecbenchError
from specbench.models.loading import LoadedModel
from specbench.trees.policy import TreePolicy


def drafter_class(drafter_cfg) -> type[Drafter]:
    return get_class(drafter_cfg._target_)


def build_drafter(drafter_cfg, target: LoadedModel, tree: TreePolicy) -> Drafter:
    """cls(target=..., tree=..., **config): a tree the method would ignore is an error, not silence."""
    cls = drafter_class(drafter_cfg)
    if tree.name not in cls.tree_policies:
        own = cls.tree_policies == ("native",)
        raise SpecbenchError(
            f"tree={tree.name} does not apply to drafter {cls.__name__}: "
            + ("it builds its own tree, so use tree=native (tree.budget sets its size)" if own else
               f"valid trees: {', '.join(cls.tree_policies)}"))
    return build(drafter_cfg, target=target, tree=tree)
