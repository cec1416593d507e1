"""Engine rows in an evaluation (eval.engines, and eval.hf_generate: transformers' plain generate): checked before
anything loads, built on the target as the run's fastest plain decoding runs it, their settings kept beside the
methods' (an engine's version, weight format, threads and options: a folder resumed under another llama.cpp is
refused), decoded interleaved per prompt like a method, and compared token by token with the project's plain
decoding (agreement: engines run other kernels, so agreement, not losslessness, is what can be said).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from specbench.acceptance.exact import ExactAcceptance
from specbench.drafters.plain import PlainDrafter
from specbench.engines.base import Engine, EngineContext, EngineUnavailable, check_greedy
from specbench.engines.registry import EngineEntry, builder, parse_engines
from specbench.errors import SpecbenchError
from specbench.evaluation.evaluator import MethodRun
from specbench.evaluation.metrics import decoded
from specbench.models.artifact import resolve_checkpoint
from specbench.models.loading import LoadedModel, layer_count, read_config, resolve_path
from specbench.names import PLAIN
from specbench.sampling import SamplingParams

log = logging.getLogger(__name__)
HF_GENERATE = "hf_generate"  # eval.hf_generate=true: transformers' plain generate, the row's name since before engines
ENGINE_COLUMNS = ["method", "engine_version", "weights", "threads", "tokens_per_s", "decode_tokens_per_s", "tau",
                  "speedup", "speedup_ci_low", "speedup_ci_high", "agreement", "identical", "agreement_reference",
                  "num_prompts"]


@dataclass
class BuiltEngine:
    entry: EngineEntry
    engine: Engine

    def settings(self) -> dict:
        if self.entry.label == HF_GENERATE:  # as before engines existed, so such folders resume
            target = self.engine.target
            return {"method": {"name": HF_GENERATE}, "dtype": str(target.model.dtype).removeprefix("torch."),
                    "backend": "eager", "weights": target.weights}
        return {"method": {"name": self.entry.label},
                "engine": {"name": self.entry.engine, "mode": self.entry.mode, **self.engine.describe()}}


def requested(cfg, sampling: SamplingParams, method_labels: list[str]) -> list[EngineEntry]:
    """eval.engines (and eval.hf_generate) checked before any model loads: each engine known and installed, greedy
    sampling, one prompt at a time, no label of a method, a GGUF for llama.cpp."""
    entries = ([EngineEntry(HF_GENERATE, "transformers", PLAIN)] if cfg.eval.hf_generate else []) \
        + parse_engines(OmegaConf.to_container(cfg.eval.engines) if cfg.eval.get("engines") is not None else None)
    if any(e.implied for e in entries) and (not sampling.greedy or cfg.eval.batch_size != 1):
        log.info("eval.engines=[installed]: the engines are left out: they decode greedily, one prompt at a time")
        entries = [e for e in entries if not e.implied]
    if not entries:
        return []
    check_greedy(sampling, "eval.hf_generate" if [e.label for e in entries] == [HF_GENERATE] else "eval.engines")
    if cfg.eval.batch_size != 1:
        raise SpecbenchError(f"eval.engines decode one prompt at a time; eval.batch_size={cfg.eval.batch_size} "
                             f"would time them against batched methods: use 1")
    return [entry for entry in entries if _runs_here(cfg, entry, method_labels)]


def _runs_here(cfg, entry: EngineEntry, method_labels: list[str]) -> bool:
    """Whether `entry` can decode this run's model (one line, SpecbenchError, where it cannot); an engine the user did
    not name (eval.engines=[installed]) is left out instead, with a log line."""
    try:
        _check_entry(cfg, entry, method_labels)
    except SpecbenchError as exc:
        if not entry.implied:
            raise
        log.info("eval.engines=[installed]: %s is left out: %s", entry.label, exc)
        return False
    return True


def _check_entry(cfg, entry: EngineEntry, method_labels: list[str]) -> None:
    """One entry's settings and model, before any model loads."""
    if entry.label in method_labels:
        raise SpecbenchError(f"methods has a label '{entry.label}', which eval.engines uses for an engine row; "
                             f"give the methods entry another label (label: NAME)")
    path = cfg.model.get("path")
    resolved = resolve_path(path) if isinstance(path, str) else None
    if entry.engine == "llama_cpp" and getattr(resolved, "suffix", None) != ".gguf":
        raise SpecbenchError(f"eval.engines entry '{entry.label}' decodes the model's GGUF file itself, and "
                             f"model.path={path!r} is none; give a model shipped as a .gguf (model=smollm2_135m) "
                             f"or drop the entry")
    if entry.engine == "openvino":  # what the exporter cannot do, said before the model loads
        from specbench.engines.openvino import DEFAULT_WEIGHTS, check_exportable, check_weights

        config = read_config(str(cfg.model.get("name", "model")), path) if isinstance(path, str) else None
        check_weights(OmegaConf.select(cfg, "eval.engine_options.openvino.weights") or DEFAULT_WEIGHTS, config)
        check_exportable(config, str(cfg.model.get("name", "model")))
        if entry.mode == "draft" and not OmegaConf.select(cfg, "eval.engine_options.openvino.draft_checkpoint"):
            raise SpecbenchError("eval.engines entry 'openvino:draft' needs a draft of the target's tokenizer: "
                                 "eval.engine_options.openvino.draft_checkpoint=PATH (a distilled draft artifact)")
    if entry.engine == "onnxruntime":
        from specbench.engines import onnxruntime

        onnxruntime.check_weights(str(OmegaConf.select(cfg, "eval.engine_options.onnxruntime.weights")
                                      or onnxruntime.DEFAULT_WEIGHTS))
    if entry.engine == "transformers":
        from specbench.engines.hf import check_options

        check_options(entry.mode, OmegaConf.to_container(cfg.eval.engine_options, resolve=True).get("transformers")
                      or {}, layer_count(cfg.model))
    if entry.mode == "draft":
        _check_draft_options(cfg, entry.engine)


def _check_draft_options(cfg, engine: str) -> None:
    """An engine's draft given one way, and its file there, before any model loads (llama.cpp takes a GGUF, `draft`,
    or the project's distilled draft, `draft_checkpoint`, never both)."""
    where = f"eval.engine_options.{engine}"
    options = {key: OmegaConf.select(cfg, f"{where}.{key}") for key in ("draft", "draft_checkpoint")}
    if engine == "llama_cpp" and all(options.values()):
        raise SpecbenchError(f"{where} gives both draft={options['draft']!r} and draft_checkpoint="
                             f"{options['draft_checkpoint']!r}: give one (a GGUF, or a distilled draft artifact)")
    draft, checkpoint = options["draft"], options["draft_checkpoint"]
    files = {"draft": None if not draft or str(draft).startswith("assemble:") else resolve_path(str(draft)),
             "draft_checkpoint": resolve_checkpoint(str(checkpoint)) if checkpoint else None}
    for key, file in files.items():
        if file is not None and not Path(file).exists():
            raise SpecbenchError(f"{where}.{key}={options[key]!r} does not exist; give the path of an existing file")


def build_engines(cfg, entries: list[EngineEntry], make_target: Callable[[], LoadedModel],
                  loaded: LoadedModel) -> list[BuiltEngine]:
    """make_target: the target eager, in the dtype and weights of the run's fastest plain decoding, made when an
    engine first reads it (EngineContext); loaded: as loaded. An engine this machine cannot run (EngineUnavailable),
    or one the user did not name that cannot run this model (a config read only once loaded), is left out with its
    reason in one line."""
    options = OmegaConf.to_container(cfg.eval.engine_options, resolve=True)
    ctx = EngineContext(make_target, loaded, str(cfg.model.get("path") or ""), int(cfg.eval.max_new_tokens), options,
                        int(options.get("threads") or torch.get_num_threads()))
    built = []
    for entry in entries:
        try:
            built.append(BuiltEngine(entry, builder(entry)(entry.mode, ctx)))
        except (EngineUnavailable, SpecbenchError) as exc:
            if not (entry.implied or isinstance(exc, EngineUnavailable)):
                raise
            log.warning("eval.engines entry '%s' is left out: %s", entry.label, exc)
            print(f"eval.engines entry '{entry.label}' is left out: {exc}")
    return built


def engine_runs(built: list[BuiltEngine], hashes: dict[str, str]) -> list[MethodRun]:
    return [MethodRun(b.entry.label, PlainDrafter(), ExactAcceptance(), hashes[b.entry.label], b.entry.label,
                      engine=b.engine) for b in built]


def agreement(ours: list[int], reference: list[int]) -> float:
    """The share of the longer answer that both give before their first differing token (1.0: identical)."""
    longest = max(len(ours), len(reference))
    if longest == 0:
        return 1.0
    same = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), min(len(ours), len(reference)))
    return same / longest


def with_agreement(summary: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """agreement of every engine row with the project's plain decoding of the closest execution (the plain
    decoding in the engine's own dtype and weights when the run has one, else the run's plain decoding), averaged over the
    prompts both decoded, and the share of identical answers (an engine row has no lossless_match: no rule of ours
    promises its tokens); beside them the engine's version."""
    records = decoded(records)
    if "engine" not in records or records["engine"].isna().all():
        return summary
    plain = records[records["method_name"] == PLAIN]
    rows = []
    for label in summary["method"]:
        grp = records[records["method"] == label]
        if grp["engine"].isna().all():
            rows.append({})
            continue
        first = grp.iloc[0]
        same = plain[(plain.get("dtype") == first.get("dtype")) & (plain.get("weights") == first.get("weights"))]
        reference = same["method"].iloc[0] if len(same) else PLAIN
        ref = plain[plain["method"] == reference].set_index(["question_id", "turn"])["output_ids"]
        shares = [agreement(r["output_ids"], ref[(r["question_id"], r["turn"])]) for _, r in grp.iterrows()
                  if (r["question_id"], r["turn"]) in ref.index]
        rows.append({"agreement": sum(shares) / len(shares) if shares else math.nan,
                     "identical": sum(s == 1.0 for s in shares) / len(shares) if shares else math.nan,
                     "agreement_reference": reference, "engine_version": first.get("engine_version")})
    return pd.concat([summary, pd.DataFrame(rows, index=summary.index)], axis=1)


def print_engines(summary: pd.DataFrame) -> None:
    if "agreement_reference" not in summary or summary["agreement_reference"].isna().all():
        return
    rows = summary[summary["agreement_reference"].notna()]
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.precision", 3):
        print(rows[[c for c in ENGINE_COLUMNS if c in rows]].to_string(index=False))
    print("engines: agreement = the share of each answer equal to the project's plain decoding (agreement_reference) "
          "up to the first differing token, averaged over prompts; identical: the share of answers equal to it")
