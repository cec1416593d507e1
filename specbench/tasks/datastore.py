"""task=datastore: SSSD's suffix-array index of a corpus for the target's tokenizer, once per model and corpus
(method=sssd also builds the default ShareGPT one on first use).

datastore=sharegpt indexes ShareGPT's conversations. datastore=self_distilled indexes the target's own greedy answers
to the first user turns of ShareGPT conversations (prompt + answer through the chat template), so SSSD's
continuations are the phrasing greedy verification accepts. The answers are training/self_distill.py's, in the cache
drafter training reads (the same key: a datastore and a training run with equal settings share it); they are appended
as they come, so an interrupted run resumes and a larger num_conversations generates only the answers missing. The
index is rebuilt from the cache each time (seconds), optionally with ShareGPT's conversations beside the answers
(with_sharegpt): a few hundred answers match as many continuations as all of ShareGPT, and the two together more
(experiments/drafters_tau). `generator=openvino` has the deployed engine write the answers (GenAI's continuous
batching on the target's IR, the engines extra), where the eager loop is too slow on a CPU for thousands of them.
"""

from __future__ import annotations

from pathlib import Path

from specbench.data.datastore import answered_turns, build_index, build_sharegpt, default_path, sharegpt_documents
from specbench.data.prompts import check_prompts, training_prompts
from specbench.errors import SpecbenchError
from specbench.models.loading import cache_root
from specbench.tasks._common import build_model
from specbench.training.features import model_fingerprint
from specbench.training.self_distill import cache_file, generate_responses, read_cache

CORPORA = ("sharegpt", "self_distilled")
GENERATORS = ("eager", "openvino")


def run(cfg) -> Path:
    settings = cfg.datastore
    corpus = settings.get("corpus", "sharegpt")
    if corpus not in CORPORA:  # the schema checks it too; a config composed elsewhere is checked here
        raise SpecbenchError(f"datastore.corpus={corpus!r} is invalid: pick one of {list(CORPORA)}")
    dtype = settings.get("dtype") or "float32"  # sharegpt reads the tokenizer alone; loading takes ~1 s
    check_prompts(answered_turns(settings), settings.num_conversations, "datastore.num_conversations")
    if corpus == "self_distilled":
        check_generator(settings)
    target = build_model(cfg.model, dtype=dtype)
    path = Path(settings.path).expanduser() if settings.get("path") else default_path(target.name)
    if corpus == "sharegpt":
        build_sharegpt(target.tokenizer, target.name, target.chat_template, settings.num_conversations, path,
                       settings.get("max_tokens"))
    else:
        build_self_distilled(target, settings, dtype, path)
    print(f"datastore for {target.name} saved at {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return path


def check_generator(settings) -> None:
    """datastore.generator and, for the engine, its weights: one line before any model loads."""
    generator = settings.get("generator") or "eager"
    if generator not in GENERATORS:  # the schema checks it too; a config composed elsewhere is checked here
        raise SpecbenchError(f"datastore.generator={generator!r} is invalid: pick one of {list(GENERATORS)}")
    if generator == "openvino":
        engine = _openvino()
        engine.check_weights(settings.generator_weights, key="datastore.generator_weights")


def _openvino():
    """The OpenVINO GenAI engine module, or one line saying how to install it."""
    try:
        from specbench.engines import openvino
    except ImportError as exc:
        raise SpecbenchError(f"datastore.generator=openvino needs OpenVINO GenAI ({exc.name} is not installed): "
                             f"pip install -e '.[engines]', or use datastore.generator=eager") from exc
    return openvino


def build_self_distilled(target, settings, dtype: str, path: Path) -> None:
    """The target's answers to the first num_conversations ShareGPT prompts (the missing ones generated first),
    indexed. generator=openvino answers by GenAI's continuous batching on the target's IR (several sequences a step,
    where the eager loop pads a batch: experiments/drafters_tau), in a cache of its own, since its weights round
    otherwise and its answers may part from the eager ones."""
    if not target.chat_template:
        raise SpecbenchError(f"datastore=self_distilled prompts the target through its chat template, which "
                             f"model={target.name} does not use (model.chat_template=false): use datastore=sharegpt")
    count, turns = settings.num_conversations, answered_turns(settings)
    generator, answerer = settings.get("generator") or "eager", None
    engine_key = {}
    if generator == "openvino":
        engine = _openvino()
        weights = str(settings.generator_weights)
        engine.check_weights(weights, target.model.config, "datastore.generator_weights")  # the group fits the widths
        engine.check_exportable(target.model.config, target.name)
        answerer = engine.BatchAnswerer(engine.export(target, weights), settings.max_new_tokens,
                                        set(target.eos_token_ids), settings.batch_size)
        engine_key = {"generator": generator, "generator_weights": weights}
    answers = cache_file(cache_root() / "training", target.name, max_prompt_tokens=settings.max_prompt_tokens,
                         max_new_tokens=settings.max_new_tokens, dtype=dtype, weights=model_fingerprint(target.model),
                         turns=turns, **engine_key)
    print(f"self-distilled answers of {target.name} to {count} ShareGPT prompts ({turns} user turns): {answers}")
    generate_responses(target, training_prompts(turns, count, "datastore.num_conversations"), answers,
                       settings.max_prompt_tokens, settings.max_new_tokens, settings.batch_size, answerer=answerer)
    records = sorted((r for r in read_cache(answers) if r["index"] < count), key=lambda r: r["index"])
    documents, described = [r["prompt"] + r["response"] for r in records], f"{len(records):,} self-distilled answers"
    extra = settings.get("with_sharegpt") or 0
    if extra:  # after the answers, so max_tokens cuts ShareGPT first
        documents += sharegpt_documents(target.tokenizer, extra, target.chat_template, "datastore.with_sharegpt")
        described += f" and {extra:,} ShareGPT conversations"
    build_index(documents, described, target.tokenizer, target.name, path, settings.get("max_tokens"),
                corpus="self_distilled", num_conversations=count, with_sharegpt=extra, **engine_key,
                **({"turns": turns} if turns != "first" else {}),
                max_prompt_tokens=settings.max_prompt_tokens, max_new_tokens=settings.max_new_tokens, dtype=dtype,
                answers=str(answers))
