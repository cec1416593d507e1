"""The type and range of every setting, checked on the composed config before any data or model loads.

`validate(cfg)` turns every bad value into one SpecbenchError naming the full key, the value and what is valid, so a
typo fails in a second instead of after a model load (or a minutes-long machine profile), and never as a traceback.

- Groups that are no function's arguments (eval, sampling, datastore, method.train, calibration, the top level)
  have a dataclass schema below: field types, plus `low`/`high`/`choices` in the field metadata.
- A node with a specbench `_target_` (model, tree, method.drafter, accept, hw, dataset, training modules) is checked
  against the target's own signature: its parameter annotations are the schema, so they cannot drift apart. Trees and
  acceptance rules are also built, since their constructors check ranges and load nothing.
- The checks are strict: OmegaConf's own typed merge would take the string 'no' for a bool (False in its copy) while
  the tasks read the composed config, where 'no' stays a truthy string; here it is refused.
- Missing mandatory values (`???`) and broken interpolations, OmegaConf errors, become the same one line.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbench.config import build
from specbench.data.datastore import answered_turns
from specbench.data.prompts import HELD_OUT_FROM, check_prompts, distilled_turns, read_jsonl
from specbench.errors import SpecbenchError
from specbench.evaluation.methods import resolve_entries
from specbench.execution.value import Execution
from specbench.evaluation.quality import check_quality
from specbench.execution.attention import check_attention
from specbench.execution.backends import AUTO, BACKENDS, OPENVINO, RUN_KEYS, check_backend
from specbench.execution.graphs import check_run
from specbench.execution.openvino import group_problem
from specbench.models.loading import DTYPES, check_model_path, load_model, read_config
from specbench.execution.quantize import FORMATS, GROUP_SIZES, GROUPED, check_backend_weights, check_weights
from specbench.models.shape import linear_input_widths
from specbench.models.tiny import tiny_config, tiny_random
from specbench.reporting.loggers import check_logger
from specbench.sampling import SamplingParams

# eval.max_new_tokens when the model config does not state its context: no shipped model's context is longer
# (gemma3_270m: 32768); the loaded model's own context is checked again once it is known (tasks/_common.py)
MAX_NEW_TOKENS = 32768
# where a target's annotation is narrower than what its configs give: conf/hw/cpu.yaml's memory_gb is `measured`,
# which HardwareSpec's `float | None` omits (specbench/hardware/modelled/spec.py; drop this once it says `float | str | None`)
ANNOTATIONS = {("specbench.hardware.modelled.spec.HardwareSpec", "memory_gb"): float | str | None}
MISSING_HINTS = {
    "dataset.path": "dataset=jsonl needs dataset.path=FILE (lines of {question_id, category, turns})",
    "model.path": "model=hf needs model.path=<local dir | file.gguf | hub id already in the offline cache>",
}


def setting(low=None, high=None, choices=None, nonempty=False):
    """A schema field: the range or choices a value must keep, and for a list whether it needs an item (the defaults
    live in conf/)."""
    return field(metadata={"low": low, "high": high, "choices": choices, "nonempty": nonempty})


@dataclass
class RunSchema:
    seed: int = setting(low=0)


@dataclass
class EvalSchema:
    num_prompts: int = setting(low=1)
    batch_size: int = setting(low=1)
    max_new_tokens: int = setting(low=1, high=MAX_NEW_TOKENS)
    dtype: str = setting(choices=[AUTO, *DTYPES])
    fastest_plain: bool = setting()
    seed: int = setting(low=0)
    warmup: int = setting(low=0)
    plain: bool = setting()
    first_turn_only: bool = setting()
    eager_reference: bool = setting()
    hf_generate: bool = setting()
    engines: list[str] = setting()  # each ENGINE[:MODE]: engines/registry.py
    engine_options: dict = setting()
    memory_probe: bool = setting()
    latency_profile: bool = setting()
    profile_sizes: list[int] = setting(low=1)
    profile_context: int = setting(low=1)
    profile_contexts: list[int] = setting(low=1, nonempty=True)
    profile_repeats: int = setting(low=1)
    profile_backends: list[str] = setting(choices=list(BACKENDS))
    profile_weights: list[str] = setting(choices=list(FORMATS))
    profile_agreement: int = setting(low=0)
    plain_executions: list[str] = setting()  # each backend/dtype[/weights]: Execution.parse (execution/value.py)
    quality: Optional[str] = setting()  # its choices and dataset: check_quality below


@dataclass
class EngineOptionsSchema:  # eval.engine_options; an engine's own group is checked where eval.engines asks for it
    threads: Optional[int] = setting(low=1)
    lookup_tokens: int = setting(low=1)
    lookup_ngram: int = setting(low=1)
    draft_tokens: int = setting(low=1)
    llama_cpp: dict = setting()
    transformers: dict = setting()
    openvino: dict = setting()
    onnxruntime: dict = setting()


@dataclass
class LlamaCppOptionsSchema:
    n_batch: int = setting(low=1)
    n_ctx: int = setting(low=1)
    draft: Optional[str] = setting()
    draft_checkpoint: Optional[str] = setting()


@dataclass
class DatastoreSchema:
    corpus: str = setting(choices=["sharegpt", "self_distilled"])
    num_conversations: int = setting(low=1)  # first turns: at most HELD_OUT_FROM (data/prompts.check_prompts)
    turns: str = setting(choices=["first", "all"])  # datastore=self_distilled: the user turns answered
    max_tokens: Optional[int] = setting(low=1)
    path: Optional[str] = setting()
    # datastore=self_distilled: how the target answers, and ShareGPT indexed beside them (tasks/datastore.py)
    with_sharegpt: int = setting(low=0, high=HELD_OUT_FROM)
    max_prompt_tokens: int = setting(low=1)
    max_new_tokens: int = setting(low=1)
    batch_size: int = setting(low=1)
    dtype: str = setting(choices=list(DTYPES))
    generator: str = setting(choices=["eager", "openvino"])
    generator_weights: str = setting()  # engines/openvino.check_weights says which


@dataclass
class TrainSchema:
    module: Any = setting()  # a training module's _target_: checked against its signature
    data: dict = setting()
    dtype: str = setting(choices=list(DTYPES))
    epochs: int = setting(low=1)
    max_steps: int = setting(low=-1)
    checkpoint_every_n_steps: int = setting(low=1)
    export: str = setting()
    resume: bool = setting()  # training/folder.py: resume a folder's training under its own settings, or start over


@dataclass
class TrainDataSchema:
    num_conversations: int = setting(low=1)
    num_val: int = setting(low=0)
    max_length: int = setting(low=2)
    batch_size: int = setting(low=1)
    num_workers: int = setting(low=0)
    feature_cache: bool = setting()
    self_distill: Optional[dict] = setting()


@dataclass
class ExportSchema:  # task=export's options
    out: Optional[str] = setting()
    verifier: Optional[str] = setting()
    dtype: str = setting(choices=["bfloat16", "float16", "float32"])
    speculative_tokens: int = setting(low=1)


@dataclass
class CalibrationSchema:  # task=calibrate's +calibration.* options
    depth: int = setting(low=1)
    ranks: int = setting(low=1)
    num_prompts: int = setting(low=1)
    max_new_tokens: int = setting(low=1, high=MAX_NEW_TOKENS)
    out: Optional[str] = setting()


@dataclass
class ReplaySchema:  # task=replay's options
    run: Optional[str] = setting()
    reference: str = setting()


def validate(cfg: DictConfig) -> None:
    """Check every setting of a composed run config; raise one SpecbenchError for the first bad one."""
    try:
        _validate(cfg)
    except OmegaConfBaseException as exc:
        raise config_error(exc) from None


def config_error(exc: OmegaConfBaseException) -> SpecbenchError:
    """An OmegaConf error (a missing value, a broken interpolation, a type) as one line naming its key."""
    key = getattr(exc, "full_key", None)
    message = str(getattr(exc, "msg", None) or exc).strip().splitlines()[0]
    return SpecbenchError(f"{key}: {message}" if key else message)


def _validate(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        key = missing[0]
        raise SpecbenchError(f"{key} is not set: " + MISSING_HINTS.get(key, f"give {key}=VALUE"))
    check_schema("", {"seed": cfg.get("seed")}, RunSchema)
    check_schema("eval", _resolved(cfg, "eval"), EvalSchema, high=_max_new_tokens(cfg))
    check_quality(OmegaConf.select(cfg, "eval.quality"), OmegaConf.select(cfg, "dataset.source"))
    for key, schema in (("eval.engine_options", EngineOptionsSchema),
                        ("eval.engine_options.llama_cpp", LlamaCppOptionsSchema)):
        check_schema(key, _resolved(cfg, key), schema)
    check_schema("sampling", _resolved(cfg, "sampling"), SamplingParams)
    SamplingParams(**_resolved(cfg, "sampling"))  # its ranges: temperature >= 0 and finite, top_p in (0, 1]
    for group, schema in (("datastore", DatastoreSchema), ("calibration", CalibrationSchema),
                          ("export", ExportSchema), ("replay", ReplaySchema)):
        if cfg.get(group) is not None:
            check_schema(group, _resolved(cfg, group), schema)
    if cfg.get("datastore") is not None:  # held-out prompts stay out of a datastore
        check_prompts(answered_turns(cfg.datastore), cfg.datastore.num_conversations, "datastore.num_conversations")
    if OmegaConf.select(cfg, "method.train") is not None:
        check_schema("method.train", _resolved(cfg, "method.train"), TrainSchema)
        check_schema("method.train.data", _resolved(cfg, "method.train.data"), TrainDataSchema)
        data = cfg.method.train.data  # held-out prompts stay out of a drafter's data
        check_prompts(distilled_turns(data.self_distill), data.num_conversations,
                      "method.train.data.num_conversations")
    shared = [k for k in cfg if k not in ("method", "tree", "accept")]
    for key in _targets(cfg, shared):
        check_target(key, _resolved(cfg, key))
    _check_inputs(cfg)
    if cfg.get("methods") is None:
        check_method(cfg)
        check_fits_model(cfg, {"tree.budget": OmegaConf.select(cfg, "tree.budget")})
        return
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    budgets = {}
    for entry in resolve_entries(cfg, overrides):
        try:
            check_method(entry.cfg)
        except SpecbenchError as exc:
            raise SpecbenchError(f"methods entry '{entry.label}': {exc}") from None
        budgets[f"methods entry '{entry.label}': tree.budget"] = OmegaConf.select(entry.cfg, "tree.budget")
    check_fits_model(cfg, budgets)


def check_fits_model(cfg: DictConfig, budgets: dict[str, object]) -> None:
    """Settings that depend on the model's shape and context, checked once its config is read (specbench.models:
    model_config), before its weights load: a tree larger than the context, an answer longer than it, and an int4 group
    size that does not divide every linear's input channels. budgets: {where: tree.budget}."""
    model = cfg.get("model")
    config = model_config(model) if model is not None else None
    if config is None:
        return
    context = int(getattr(config, "max_position_embeddings", 0) or 0)
    name = model.get("name", "?")
    if context:
        for where, budget in budgets.items():
            if isinstance(budget, int) and not isinstance(budget, bool) and budget > context:
                raise SpecbenchError(f"{where}={budget} is invalid: a tree of {budget} nodes cannot fit model "
                                     f"{name}'s context of {context} tokens; it must be an integer <= {context}")
        tokens = OmegaConf.select(cfg, "eval.max_new_tokens")
        if isinstance(tokens, int) and tokens > context - 1:
            raise SpecbenchError(f"eval.max_new_tokens={tokens} is invalid: it must be an integer <= {context - 1} "
                                 f"(model {name}'s context of {context} tokens less one prompt token)")
    if int4_used(cfg):
        group = model.get("group_size", 32)
        inputs = linear_input_widths(config)
        if model.get("backend") == OPENVINO:  # NNCF groups the channels, not aten's kernel
            if problem := group_problem(config, f"int4_g{group}"):
                raise SpecbenchError(f"model.group_size={group} is invalid for model {name} on model.backend=openvino: "
                                     f"{problem}")
        elif model.get("backend") != "onnxruntime" and any(n % group for n in inputs):  # MatMulNBits pads a block
            fits = [g for g in GROUP_SIZES if not any(n % g for n in inputs)]
            raise SpecbenchError(f"model.group_size={group} is invalid for model {name}: it must divide every "
                                 f"linear's input channels ({', '.join(map(str, inputs))}); "
                                 + (f"give one of {', '.join(map(str, fits))}" if fits else "none does: use int8"))


def int4_used(cfg: DictConfig) -> bool:
    """Whether the run quantises the target to int4 somewhere: its weights, the formats a profile measures for
    weights=auto or the fastest plain decoding, or an extra plain decoding."""
    weights = OmegaConf.select(cfg, "model.weights", default="fp")
    profiled = list(OmegaConf.select(cfg, "eval.profile_weights", default=None) or [])
    fastest = OmegaConf.select(cfg, "eval.fastest_plain", default=False)
    plain = [str(t) for t in OmegaConf.select(cfg, "eval.plain_executions", default=None) or []]
    return (weights in GROUPED or ((weights == AUTO or fastest) and any(w in GROUPED for w in profiled))
            or any(w in t for t in plain for w in GROUPED))


def model_config(model: DictConfig):
    """The transformers config of the model node, read without weights; None for a loader that cannot say."""
    target = get_object(model["_target_"]) if "_target_" in model else None
    values = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items() if k != "_target_"}
    if target is tiny_random:
        wanted = inspect.signature(tiny_config).parameters
        return tiny_config(**{k: v for k, v in values.items() if k in wanted and k != "tokenizer"})
    if target is load_model and isinstance(values.get("path"), str):
        return read_config(values.get("name", "model"), values["path"])
    return None


def check_method(cfg: DictConfig) -> None:
    """One method's nodes (method, tree, accept): every target against its signature; trees and acceptance rules
    built, which checks their ranges."""
    for key in _targets(cfg, ["method", "tree", "accept"]):
        check_target(key, _resolved(cfg, key))
    drafter = _resolved(cfg, "method.drafter")
    if str(drafter.get("_target_", "")).startswith("specbench."):
        cls = get_object(drafter["_target_"])
        defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        cls.check_config(defaults | {k: v for k, v in drafter.items() if not k.startswith("_")})
    for key in ("tree", "accept"):
        if cfg.get(key) is not None:
            build(cfg[key])


def check_schema(prefix: str, values: dict, schema, high: dict | None = None) -> None:
    """values against a dataclass schema: no unknown key, each value of its field's type and range;
    high: upper bounds that depend on other settings, as {key: (bound, why)}."""
    specs = {f.name: f for f in fields(schema)}
    hints = typing.get_type_hints(schema)
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in specs:
            raise SpecbenchError(f"{key} is not a setting; valid keys of {prefix}: {', '.join(specs)}")
        check_type(key, value, hints[name])
        meta = specs[name].metadata
        if meta.get("nonempty") and value == []:
            raise SpecbenchError(f"{key}=[] is invalid: it must be a list of at least one item")
        bound, why = (high or {}).get(name, (meta.get("high"), None))
        check_range(key, value, meta.get("low"), bound, meta.get("choices"), why)


def check_target(key: str, values: dict) -> None:
    """A node instantiated by Hydra: each key a parameter of its _target_, of the annotated type (a model's RUN_KEYS
    are the task's, checked in _check_inputs; a draft model's, method.draft.model, are the run's too)."""
    if key.rsplit(".", 1)[-1] == "model":
        values = {k: v for k, v in values.items() if k not in RUN_KEYS}
    target = get_object(values["_target_"])
    params = inspect.signature(target).parameters
    hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for name, value in values.items():
        if name.startswith("_"):  # _target_, _recursive_, _convert_, _partial_: Hydra's own
            continue
        if name not in params and not takes_any:
            valid = ", ".join(p for p in params if params[p].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD)
            raise SpecbenchError(f"{key}.{name} is not a setting of {values['_target_']}; valid keys: {valid}")
        check_type(f"{key}.{name}", value, ANNOTATIONS.get((values["_target_"], name), hints.get(name, Any)))


def check_type(key: str, value, annotation) -> None:
    if not _fits(value, annotation):
        raise SpecbenchError(f"{key}={value!r} is invalid: it must be {_describe(annotation)}")


def check_range(key: str, value, low=None, high=None, choices=None, why: str | None = None) -> None:
    for item in value if isinstance(value, list) else [value]:
        if choices is not None and item not in choices:
            raise SpecbenchError(f"{key}={value!r} is invalid: valid choices: {', '.join(map(str, choices))}")
        kind = "an integer" if isinstance(item, int) else "a number"
        if low is not None and item is not None and item < low:
            raise SpecbenchError(f"{key}={value!r} is invalid: it must be {kind} >= {low}")
        if high is not None and item is not None and item > high:
            raise SpecbenchError(f"{key}={value!r} is invalid: it must be {kind} <= {high}"
                                 + (f" ({why})" if why else ""))


def _fits(value, annotation) -> bool:
    """Strict: a bool is no integer, a string no number; an int is a number; NaN and infinity are no setting."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    if annotation is list or origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value) if args else isinstance(value, list)
    if annotation is dict or origin is dict:
        return isinstance(value, dict)
    return True  # a class (a loaded model, a callable): not a config value's type to check


def _describe(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is list and args:
        return f"a list of {_plural(args[0])}"
    return _NAMES.get(annotation, f"a {getattr(annotation, '__name__', annotation)}")


def _plural(annotation) -> str:
    if typing.get_origin(annotation) is list and typing.get_args(annotation):
        return f"lists of {_plural(typing.get_args(annotation)[0])}"
    return _PLURAL.get(annotation, "values")


_NAMES = {type(None): "null", bool: "true or false", int: "an integer", float: "a finite number", str: "a string",
          list: "a list", dict: "a mapping"}
_PLURAL = {int: "integers", float: "finite numbers", str: "strings", bool: "booleans"}


def _resolved(cfg: DictConfig, key: str) -> dict:
    node = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else {}


def _targets(cfg: DictConfig, roots: list[str]) -> list[str]:
    """Full keys of the nodes under roots whose _target_ is one of ours (Lightning and Hydra check their own)."""
    found, raw = [], OmegaConf.to_container(cfg, resolve=False)

    def walk(node, key):
        if isinstance(node, dict):
            if str(node.get("_target_", "")).startswith("specbench."):
                found.append(key)
            for name, child in node.items():
                walk(child, f"{key}.{name}")

    for root in roots:
        walk(raw.get(root), root)
    return found


def _max_new_tokens(cfg: DictConfig) -> dict:
    """eval.max_new_tokens' upper bound: below the model's context when its config states it (a prompt takes at
    least one token), else MAX_NEW_TOKENS."""
    context = OmegaConf.select(cfg, "model.max_context")
    if isinstance(context, int) and not isinstance(context, bool):
        return {"max_new_tokens": (context - 1, f"model.max_context={context} less one prompt token")}
    return {"max_new_tokens": (MAX_NEW_TOKENS, "no shipped model's context is longer; the loaded model's own "
                                               "context is checked when it loads")}


def _check_inputs(cfg: DictConfig) -> None:
    """The model's backend, and the files the settings name: the model's path and a JSONL dataset (read: a bad line,
    a repeated question_id or a non-UTF-8 byte is found now, not after the model loads)."""
    model = cfg.get("model")
    if model is not None and model.get("backend") is not None:
        check_backend(model.backend)
        check_run(model.backend, OmegaConf.select(cfg, "hw.device") or "cpu",
                  OmegaConf.select(cfg, "eval.batch_size") or 1)
    if model is not None and model.get("attention") is not None:
        check_attention(model.attention)
    if model is not None and model.get("weights") is not None:
        check_weights(model.weights, model.get("group_size", 32), backend=model.get("backend", "eager"))
        check_backend_weights(model.weights, model.get("backend", "eager"))
    for text in OmegaConf.select(cfg, "eval.plain_executions") or []:
        Execution.parse(text, model.get("group_size", 32) if model is not None else 32)
    if model is not None and model.get("path") is not None:
        check_model_path(model.path)
    check_logger(cfg.get("logger"))
    dataset = cfg.get("dataset")
    if dataset is not None and dataset.get("source") == "jsonl":
        if not dataset.get("path"):
            raise SpecbenchError(f"dataset.path is not set: {MISSING_HINTS['dataset.path']}")
        read_jsonl(dataset.path)
