"""Plan an evaluation: which methods and plain decodings decode, on which backend and dtype, under which settings.

An evaluation is plan -> decode -> summarise (tasks/eval.py wires the three). `request` checks what the config asks
for before anything loads; `plan_runs`, with the target loaded, reads the machine profile, picks the execution,
builds each drafter, fits it to this machine and saves the run folder's settings. Plain decoding runs beside the
methods on the run's own execution and, when it differs, on the execution fastest for one token here: the headline
speedup is judged against the fastest plain decoding measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
from hydra.core.hydra_config import HydraConfig

from specbench.acceptance.exact import ExactAcceptance
from specbench.config import build
from specbench.drafters.base import Drafter
from specbench.drafters.plain import PlainDrafter
from specbench.errors import SpecbenchError
from specbench.evaluation.evaluator import EvalSettings, MethodRun
from specbench.evaluation.engines import build_engines, engine_runs, requested
from specbench.evaluation.methods import MethodEntry, build_drafter, check_early_exit, check_tree, resolve_entries
from specbench.evaluation.metrics import EAGER_REFERENCE
from specbench.evaluation.precision import AUTO, ExecutionPlan, check_dtype, plan
from specbench.evaluation.run_folder import check_and_save_settings, shared_settings
from specbench.evaluation.run_folder import settings_hash as hash_of
from specbench.hardware.measured.machine_profile import MachineProfile, load_or_measure_profile
from specbench.hardware.modelled.roofline import roofline_step_time
from specbench.hardware.modelled.spec import MEASURED, HardwareSpec
from specbench.execution.attention import attention_tag
from specbench.execution.backends import (ONNXRUNTIME, OPENVINO, OWN_GRAPH, check_backend, check_profile_backends,
                                         or_eager, with_backend)
from specbench.execution.onnxruntime import check_run as check_onnxruntime
from specbench.execution.value import Execution
from specbench.execution.openvino import OWN_FORMATS, check_run as check_openvino
from specbench.models.loading import LoadedModel, layer_count, read_config
from specbench.execution.quantize import FORMATS, check_backend_weights, check_weights, format_name, split_format
from specbench.models.shape import ModelShape
from specbench.names import PLAIN
from specbench.sampling import SamplingParams
from specbench.trees.hardware_aware import HardwareAwarePolicy
from specbench.trees.policy import TreePolicy

log = logging.getLogger(__name__)
PLAIN_SETTINGS = {"method": {"name": PLAIN}, "accept": {"name": "exact"}}


@dataclass
class Request:
    """What the config asks for, checked; nothing is loaded yet."""

    settings: EvalSettings
    sampling: SamplingParams
    entries: list[MethodEntry]
    trees: list[TreePolicy]  # each entry's tree policy, unfitted: a hardware-aware one has only its cap yet
    profile_backends: list[str]
    engines: list  # eval.engines (and eval.hf_generate) as EngineEntry: the engine rows (evaluation/engines.py)

    @property
    def sized(self) -> bool:
        """Some method sizes its tree from this machine's L(n): a hardware-aware tree, or a drafter asked to size
        its own per step (method.drafter.sized: SSSD, suffix decoding, the hybrid)."""
        return (any(isinstance(t, HardwareAwarePolicy) for t in self.trees)
                or any(e.cfg.method.drafter.get("sized", False) for e in self.entries))


@dataclass
class Plan:
    target: LoadedModel  # in the run's dtype, on its backend
    execution: ExecutionPlan
    runs: list[MethodRun]  # the extra plain decodings first, then the methods (the Evaluator adds plain decoding)
    machine: MachineProfile | None
    context: float  # the context L(n) is read at: the profile's plus half an answer
    settings_hash: dict[str, str]  # label -> hash of the settings its records carry
    settings: EvalSettings  # the request's, with the target's chat template


def request(cfg, overrides: list[str] | None = None) -> Request:
    """overrides: the command line's, which every `methods` entry is composed on (read from Hydra inside a run)."""
    settings = EvalSettings(max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.eval.seed, warmup=cfg.eval.warmup,
                            plain=cfg.eval.plain, first_turn_only=cfg.eval.first_turn_only,
                            memory_probe=cfg.eval.memory_probe, batch_size=cfg.eval.batch_size)
    check_dtype(cfg.eval.dtype)
    check_backend(cfg.model.backend)
    profile_backends = check_profile_backends(cfg.eval.profile_backends)
    weights, _ = run_weights(cfg)  # model.weights, model.group_size and eval.profile_weights
    check_backend_weights(cfg.model.get("weights", "fp"), cfg.model.backend)
    if cfg.model.backend in (OPENVINO, ONNXRUNTIME):  # what the route cannot run, said before the model loads
        path = cfg.model.get("path")
        config = read_config(str(cfg.model.get("name", "model")), path) if isinstance(path, str) else None
        if cfg.model.backend == OPENVINO:
            check_openvino(cfg.eval.dtype, weights, config, cfg.eval.batch_size)
        else:
            check_onnxruntime(cfg.eval.dtype, weights, cfg.eval.batch_size, config)
    for text in cfg.eval.get("plain_executions") or []:
        Execution.parse(text, cfg.model.get("group_size", 32))
    sampling = SamplingParams(**cfg.sampling)
    if overrides is None and HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    entries = resolve_entries(cfg, overrides or [])
    trees = [build(e.cfg.tree) for e in entries]
    layers = layer_count(cfg.model)
    for entry, tree in zip(entries, trees):
        check_tree(entry.cfg.method.drafter, tree)
        check_early_exit(entry.cfg.method, str(cfg.model.get("name", "model")), layers)
    engines = requested(cfg, sampling, [e.label for e in entries])
    return Request(settings, sampling, entries, trees, profile_backends, engines)


def plan_runs(cfg, req: Request, hw: HardwareSpec, loaded: LoadedModel, out: Path) -> Plan:
    """loaded: the target as setup_target loads it (eager, float32 under eval.dtype=auto)."""
    backend = cfg.model.backend
    wants_profile = AUTO in (cfg.eval.dtype, backend) or cfg.eval.fastest_plain or req.sized
    # measure what the run's own choices need: the backends auto or the fastest plain decoding choose among, with
    # a named backend beside them (the run executes it); every dtype only where auto or the fastest one chooses
    if backend == AUTO:
        backends = or_eager(req.profile_backends, loaded.model.device, loaded.model.config)
    else:
        backends = list(dict.fromkeys([*req.profile_backends, backend])) if cfg.eval.fastest_plain else [backend]
    dtypes = None if cfg.eval.dtype == AUTO or cfg.eval.fastest_plain else [cfg.eval.dtype]
    weights, formats = run_weights(cfg)
    machine = load_or_measure_profile(loaded, dtypes=dtypes, sizes=profile_sizes(cfg, req.trees),
                                      contexts=profile_contexts(cfg), backends=backends,
                                      weights=formats).only(backends, dtypes, formats) if wants_profile else None
    context = cfg.eval.profile_context + cfg.eval.max_new_tokens / 2
    # the plain decodings are ranked by a whole answer, prefill included, as the headline's tokens/s counts them;
    # before the data loads, the profile's context stands for the prompt's length
    execution = plan(cfg.eval.dtype, backend, machine, float(np.mean([t.budget for t in req.trees])), context,
                     weights, formats, (cfg.eval.profile_context, cfg.eval.max_new_tokens))
    log.info("backend/dtype/weights %s", execution.reason)
    if machine is not None and formats == ["fp"]:
        log.info("speedup_any weighs float weights only (eval.profile_weights=[fp]); eval.profile_weights=[fp,int8,int4] "
                 "adds the quantised targets' plain decoding (measured once per machine)")
    # drafters are built on the eager model in the run's dtype and weights (build_drafter says why); an openvino or
    # onnxruntime target quantises its float weights itself, and its drafters read the float model
    own_graph = execution.backend in OWN_GRAPH
    cast = Execution("eager", execution.dtype, "fp" if own_graph else execution.weights).apply(loaded)
    target = execution.own.apply(loaded) if own_graph else with_backend(cast, execution.backend)
    latency = latency_curve(hw, machine, target, execution, context) if req.sized else None
    # drafters before settings: building one may make its one-time artifact (SSSD's default datastore), whose
    # fingerprint is part of the method's settings
    drafters = [_drafter(e, tree, cast, execution.backend, latency) for e, tree in zip(req.entries, req.trees)]
    if execution.backend == ONNXRUNTIME:
        check_token_only(req.entries, drafters)

    _, fast_d, fast_w = execution.fastest_plain
    per_method = {e.label: e.settings() for e in req.entries} | {PLAIN: PLAIN_SETTINGS}
    fastest = fastest_plain_runs(cfg, execution)  # label -> execution: the headline's references
    per_method |= {label: {**PLAIN_SETTINGS, "dtype": d, "backend": b, "weights": w}
                   for label, (b, d, w) in fastest.items()}
    also = plain_executions(cfg, execution)  # label -> execution: eval.plain_executions
    per_method |= {label: {**PLAIN_SETTINGS, "dtype": d, "backend": b, "weights": w}
                   for label, (b, d, w) in also.items()}
    eager_ref = (cfg.eval.eager_reference and execution.backend not in ("eager", *OWN_GRAPH)
                 and EAGER_REFERENCE not in fastest)
    if eager_ref:  # the run's dtype on transformers' own forward: every method's tokens are also checked against it
        per_method[EAGER_REFERENCE] = {**PLAIN_SETTINGS, "dtype": execution.dtype, "backend": "eager"}

    def cast_to(d: str, w: str) -> LoadedModel:
        return cast if (d, w) == (execution.dtype, cast.weights) else Execution("eager", d, w).apply(loaded)

    def run_as(b: str, d: str, w: str) -> LoadedModel:
        if (b, d, w) == execution.own:
            return target
        return Execution(b, d, w).apply(loaded) if b in OWN_GRAPH else with_backend(cast_to(d, w), b)

    # engines run on the eager model in the fastest plain decoding's dtype and weights; OpenVINO's own w4a8 formats
    # have no eager form, so theirs is the int4 one they quantise on the fly
    head, group = split_format(fast_w)
    eager_w = format_name("int4", group) if head in OWN_FORMATS else fast_w
    engines = build_engines(cfg, req.engines, lambda: cast_to(fast_d, eager_w), loaded) if req.engines else []
    per_method |= {b.entry.label: b.settings() for b in engines}
    shared = shared_settings(cfg, execution.dtype, execution.backend, execution.weights, attention_tag(loaded))
    check_and_save_settings(out, shared, per_method)
    hashes = {label: hash_of(shared, m) for label, m in per_method.items()}

    runs = [MethodRun(e.label, drafter, build(e.cfg.accept), hashes[e.label], e.name)
            for e, drafter in zip(req.entries, drafters)]
    plain = [MethodRun(label, PlainDrafter(), ExactAcceptance(), hashes[label], PLAIN,
                       run_as(b, d, w)) for label, (b, d, w) in (fastest | also).items()]
    if eager_ref:
        plain.append(MethodRun(EAGER_REFERENCE, PlainDrafter(), ExactAcceptance(), hashes[EAGER_REFERENCE],
                               PLAIN, cast))
    runs = plain + runs + engine_runs(engines, hashes)
    return Plan(target, execution, runs, machine, context, hashes,
                replace(req.settings, chat_template=target.chat_template))


def _drafter(entry: MethodEntry, tree: TreePolicy, cast: LoadedModel, backend: str,
             latency: Callable[[float], float] | None):
    drafter = build_drafter(entry.cfg.method.drafter, cast, tree, backend)
    if latency is not None:
        drafter.fit(latency)
    return drafter


def profile_sizes(cfg, trees) -> list[int]:
    """eval.profile_sizes up to the first that holds the run's largest tree (a hardware-aware tree's cap): what its
    choices read, with one row always (the fastest plain decoding is judged by L(1)). A later run with larger trees
    measures the rest (the profile keeps what it has)."""
    sizes = sorted({1, *cfg.eval.profile_sizes})
    need = max(t.budget for t in trees)
    return list(dict.fromkeys([s for s in sizes if s < need] + [next((s for s in sizes if s >= need), sizes[-1])]))


def profile_contexts(cfg) -> list[int]:
    """eval.profile_contexts up to the first that holds the run's own context (profile_context + max_new_tokens):
    a first look at 32 new tokens reads no L(n) at 1024, the costliest context to measure. A longer run measures the
    rest (the profile keeps what it has)."""
    contexts = sorted(set(cfg.eval.profile_contexts))
    need = cfg.eval.profile_context + cfg.eval.max_new_tokens
    holds = next((c for c in contexts if c >= need), contexts[-1])
    return list(dict.fromkeys([c for c in contexts if c < need] + [holds]))


def latency_curve(hw: HardwareSpec, machine: MachineProfile | None, target: LoadedModel, execution: ExecutionPlan,
                  context: float) -> Callable[[float], float]:
    """L(n) in ms for a sized draft (n an integer): measured here (hw=cpu/cuda read the machine profile) or, for a
    board spec one projects to, its roofline at the board's own bytes per parameter."""
    if hw.peak_tflops == MEASURED:
        # n rows cost what the rows the target pads them to cost (OpenVINO's static models), not a line between
        # the measured counts
        padded = getattr(target.model, "padded_rows", lambda n: n)
        return lambda n: machine.latency_ms(execution.dtype, padded(n), context, execution.backend, execution.weights)
    shape = ModelShape.of(target.model)
    return lambda n: 1e3 * roofline_step_time(shape, hw, n, context)


def fastest_plain_runs(cfg, execution: ExecutionPlan) -> dict[str, Execution]:
    """{plain@<what differs>: execution} for the fastest plain decoding of the run's own weights (the
    headline's reference) and of any weights (beside it), each where it is not the run's own execution."""
    if not (cfg.eval.plain and cfg.eval.fastest_plain):
        return {}
    found = [e for e in (execution.same_weights_plain, execution.fastest_plain) if e != execution.own]
    return {f"{PLAIN}@{execution.label_of(e)}": e for e in dict.fromkeys(found)}


def plain_executions(cfg, execution: ExecutionPlan) -> dict[str, Execution]:
    """eval.plain_executions as {plain@backend/dtype[/weights]: execution}: plain decodings the run adds
    beside its own and the fastest one (those two are left out here), e.g. to set every execution's tokens/s against
    transformers' generate in one run."""
    group = cfg.model.get("group_size", 32)
    skip = {execution.own, execution.fastest_plain, execution.same_weights_plain}
    found = [Execution.parse(text, group) for text in cfg.eval.get("plain_executions") or []]
    return {f"{PLAIN}@{e.label}": e for e in dict.fromkeys(found) if e not in skip}


def run_weights(cfg) -> tuple[str, list[str]]:
    """(the run's weights: auto or a format name, the formats the machine profile measures and the fastest plain
    decoding is chosen among): eval.profile_weights, with model.weights itself when it names one."""
    group, weights = cfg.model.get("group_size", 32), cfg.model.get("weights", "fp")
    check_weights(weights, group, backend=cfg.model.get("backend", "eager"))
    if not set(cfg.eval.profile_weights) <= set(FORMATS):
        raise SpecbenchError(f"eval.profile_weights={list(cfg.eval.profile_weights)} is invalid: give one or more of "
                             f"{', '.join(FORMATS)}")
    formats = list(dict.fromkeys(format_name(w, group) for w in cfg.eval.profile_weights))
    if weights == AUTO:
        return AUTO, formats
    return format_name(weights, group), list(dict.fromkeys([*formats, format_name(weights, group)]))


def check_token_only(entries: list[MethodEntry], drafters: list[Drafter]) -> None:
    """One line, before any prompt decodes, for a method whose drafter reads the target's hidden states or adds rows of
    embeddings to its verify: model.backend=onnxruntime's graph takes token ids and returns logits only."""
    for entry, drafter in zip(entries, drafters):
        if drafter.needs_hidden_states or type(drafter).verify_extras is not Drafter.verify_extras:
            raise SpecbenchError(f"methods entry '{entry.label}' (method={entry.name}) reads the target's hidden states "
                                 f"or feeds it embeddings, which model.backend=onnxruntime's graph does not return or "
                                 f"take; run it on another backend (model.backend=openvino runs every method)")
