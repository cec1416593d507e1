"""The methods of one evaluation: each entry of `methods=[...]` (or the single `method=`) composed into its own
method/tree/accept config, and its drafter built with a check that the tree policy is one it uses.

An entry is a method config name (`pld`) or a mapping `{method: medusa, overrides: [tree.budget=8], label: medusa-8}`.
Entries are composed with Hydra's compose API on top of the run's own overrides, so a method config's defaults (its
tree policy and budget) and the run's `tree=`/`accept=` choices resolve exactly as they would for `method=NAME`.
"""

from __future__ import annotations

import copy
import re
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.config import CONF_DIR, build
from specbench.data.datastore import default_path
from specbench.drafters.base import Drafter
from specbench.errors import SpecbenchError
from specbench.evaluation.engines import HF_GENERATE

from specbench.execution.backends import ONNXRUNTIME, OPENVINO, with_backend
from specbench.models.loading import LoadedModel
from specbench.models.published.files import content_fingerprint
from specbench.names import PLAIN, is_plain
from specbench.trees.policy import TreePolicy

PER_METHOD = ("method", "tree", "accept")  # the config nodes an entry owns; everything else is the run's
# what a label may hold: a generated one (medusa[tree.budget=8], medusa[tree=dynamic,+method.x=1]) fits, a path does not
LABEL_CHARS = re.compile(r"[A-Za-z0-9_\-.,=\[\]+@:]+")
PLAIN_DRAFTER = "specbench.drafters.plain.PlainDrafter"


@dataclass
class MethodEntry:
    label: str  # the name in records and summaries; unique within a run
    cfg: DictConfig  # the run's config with this entry's method, tree and accept

    @property
    def name(self) -> str:
        return self.cfg.method.name

    def settings(self) -> dict:
        """What of this entry changes results (training recipes do not), with what its checkpoint and datastore hold
        now: heads retrained, or a datastore rebuilt, at the same path are not what a folder's records were decoded
        with."""
        out = {k: OmegaConf.to_container(self.cfg[k], resolve=True) for k in PER_METHOD}
        out["method"].pop("train", None)
        if out["method"].get("checkpoint"):
            out["method"]["checkpoint_fingerprint"] = content_fingerprint(out["method"]["checkpoint"])
        drafter = out["method"].get("drafter") or {}
        if "datastore" in (drafter.get("sources") or ()):
            path = drafter.get("datastore") or default_path(self.cfg.model.name)
            out["method"]["datastore_fingerprint"] = content_fingerprint(path)
        return out


def method_options() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))


def _parse(entry) -> tuple[str, list[str], str | None]:
    if isinstance(entry, str):
        return entry, [], None
    if isinstance(entry, (dict, DictConfig)) and "method" in entry and set(entry) <= {"method", "overrides", "label"}:
        overrides = entry.get("overrides") or []
        if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
            raise SpecbenchError(f"methods entry {OmegaConf.to_container(entry) if isinstance(entry, DictConfig) else entry}"
                                 f" has invalid overrides: give a list of strings such as [tree.budget=8]")
        return str(entry["method"]), list(overrides), entry.get("label")
    shown = OmegaConf.to_container(entry) if isinstance(entry, (DictConfig, ListConfig)) else entry
    raise SpecbenchError(f"methods entry {shown!r} is invalid: give a method name (pld) or a mapping "
                         f"{{method: NAME, overrides: [key=value, ...], label: NAME}}")


def resolve_entries(cfg: DictConfig, run_overrides: list[str] = ()) -> list[MethodEntry]:
    """The run's methods in order: `methods` when set, else the single `method`."""
    methods = cfg.get("methods")
    if methods is None:
        label = str(cfg.method.name)
        check_label(label, f"method.name={label}", "give another method.name")
        if is_plain_label(label) and OmegaConf.select(cfg, "method.drafter._target_") != PLAIN_DRAFTER:
            raise SpecbenchError(f"method.name={label} is invalid: it names plain decoding, which only the drafter "
                                 f"that proposes nothing (method=plain) may carry; give method.name another name")
        return [MethodEntry(label, cfg)]
    if not isinstance(methods, ListConfig) or len(methods) == 0:
        raise SpecbenchError(f"methods={methods!r} is invalid: give a non-empty list such as [pld,medusa,ppd]")
    base = [o for o in run_overrides if not o.split("=", 1)[0].lstrip("+~") in ("method", "methods")]
    entries, known = [], method_options()
    for raw in methods:
        name, overrides, label = _parse(raw)
        if name not in known:
            raise SpecbenchError(f"methods entry '{name}' is not a method config; valid: {', '.join(known)}")
        given = label is not None
        label = str(label) if given else name if not overrides else f"{name}[{','.join(overrides)}]"
        where = f"methods entry label '{label}'" if given else \
            f"methods entry '{name}' with overrides {overrides}: its label '{label}'"
        check_label(label, where, f"give the entry {'another' if given else 'a'} label (label: NAME)")
        if is_plain_label(label):
            raise SpecbenchError(f"{where} is invalid: {PLAIN}, {PLAIN}@... and {HF_GENERATE} name the "
                                 f"plain decodings the run adds itself, and records under them would be read as plain "
                                 f"decoding; give the entry another label (label: NAME)")
        if label in {e.label for e in entries}:
            raise SpecbenchError(f"methods lists '{label}' twice; give each entry its own label (label: NAME)")
        composed = _compose([*base, f"method={name}", *overrides])
        merged = cfg.copy()
        for key in PER_METHOD:
            merged[key] = composed[key]
        merged.methods = None
        entries.append(MethodEntry(label, merged))
    return entries


def is_plain_label(label: str) -> bool:
    return is_plain(label) or label == HF_GENERATE


def check_label(label: str, where: str, fix: str) -> None:
    """A label names records and summary rows and may reach file and folder names: one path component of safe
    characters."""
    if not LABEL_CHARS.fullmatch(label) or ".." in label:
        raise SpecbenchError(f"{where} is invalid: a label is letters, digits and _-.,=[]+@: without '..' (no path "
                             f"separator or space); {fix}")


def _compose(overrides: list[str]) -> DictConfig:
    """compose() inside a running Hydra app reuses its search path; elsewhere (tests, notebooks) it opens ours. A copy
    of a cached composition: composing a whole config is slow next to a lookup, and a run resolves its entries twice
    (the settings check, then the evaluation), as validating the saved experiments resolves the same entries in many
    of them."""
    return copy.deepcopy(_composed(tuple(overrides), GlobalHydra.instance().is_initialized()))


@lru_cache(maxsize=256)
def _composed(overrides: tuple[str, ...], in_app: bool) -> DictConfig:
    context = nullcontext() if in_app else initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    try:
        with context:
            return compose(config_name="config", overrides=list(overrides))
    except HydraException as exc:
        raise SpecbenchError(f"methods entry with overrides {list(overrides)} does not compose: "
                             f"{str(exc).splitlines()[0]}") from exc


def drafter_class(drafter_cfg) -> type[Drafter]:
    return get_class(drafter_cfg._target_)


def build_drafter(drafter_cfg, target: LoadedModel, tree: TreePolicy, backend: str = "eager") -> Drafter:
    """cls(target=..., tree=..., **config): a tree the method would ignore is an error, not silence.

    target is the eager model: a drafter may slice it (an early-exit draft) or merge an adapter into a copy (Medusa-2),
    which a compiled or prepacked forward cannot take. The models it derives so then run on `backend`, the run's, as
    the target does (Drafter.on_backend); on openvino they stay eager (an IR export per derived model is not
    built), and what it drafts with every step runs on OpenVINO (Drafter.on_openvino)."""
    check_tree(drafter_cfg, tree)
    drafter = build(drafter_cfg, target=target, tree=tree)
    if backend == OPENVINO:
        drafter.on_openvino()
    elif backend != ONNXRUNTIME:  # the builder's graph is the target's alone: what a drafter derives stays eager
        drafter.on_backend(lambda derived: with_backend(derived, backend))
    return drafter


def check_early_exit(method_cfg, model_name: str, limit: int | None) -> None:
    """method.draft.early_exit_layers, when the draft is the target's first layers (no checkpoint), within the
    target's `limit` layers, said before any model loads (early_exit says it again at the build)."""
    layers = (method_cfg.get("draft") or {}).get("early_exit_layers")
    if layers is None or method_cfg.get("checkpoint") or limit is None:
        return
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= limit:
        raise SpecbenchError(f"method.draft.early_exit_layers={layers!r} is invalid: '{model_name}' has {limit} "
                             f"layers, so use 1..{limit}")


def check_tree(drafter_cfg, tree: TreePolicy) -> None:
    cls = drafter_class(drafter_cfg)
    if tree.name not in cls.tree_policies:
        own = cls.tree_policies == ("native",)
        raise SpecbenchError(
            f"tree={tree.name} does not apply to drafter {cls.__name__}: "
            + ("it builds its own tree, so use tree=native (tree.budget sets its size)" if own else
               f"valid trees: {', '.join(cls.tree_policies)}"))

