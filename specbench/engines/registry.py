"""The engines a run may add (eval.engines=[ENGINE[:MODE], ...]), their modes and the package each needs, checked
before any model loads: an engine whose package is missing is one line naming the install command.

Each engine's module is imported only when a run builds it, so a checkout without the `engines` extra runs as before.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from specbench.engines.base import INSTALL
from specbench.errors import SpecbenchError
from specbench.names import PLAIN


@dataclass(frozen=True)
class EngineKind:
    module: str  # the import it needs
    package: str  # its pip name
    modes: tuple[str, ...]  # plain first, then its own speculative modes
    builder: str  # MODULE:FUNCTION(mode, EngineContext) -> Engine
    also: tuple[str, ...] = ()  # further imports it needs, installed with it by the engines extra


ENGINES: dict[str, EngineKind] = {
    "transformers": EngineKind("transformers", "transformers", (PLAIN, "prompt_lookup", "assistant", "universal"),
                               "specbench.engines.hf:build"),
    "llama_cpp": EngineKind("llama_cpp", "llama-cpp-python", (PLAIN, "prompt_lookup", "draft"),
                            "specbench.engines.llama_cpp:build"),
    "openvino": EngineKind("openvino_genai", "openvino-genai", (PLAIN, "prompt_lookup", "draft"),
                           "specbench.engines.openvino:build", also=("openvino_tokenizers", "nncf")),
    "onnxruntime": EngineKind("onnxruntime_genai", "onnxruntime-genai", (PLAIN,), "specbench.engines.onnxruntime:build",
                              also=("onnxruntime", "onnx_ir")),
}


@dataclass(frozen=True)
class EngineEntry:
    label: str  # the row's name in records and summaries: ENGINE or ENGINE:MODE
    engine: str
    mode: str
    implied: bool = False  # named by `installed`, not by the user: left out, with a log line, where it cannot run

    @property
    def kind(self) -> EngineKind:
        return ENGINES[self.engine]


# eval.engines=[installed]: the plain decoding of every engine users deploy whose package is installed here
# (transformers' generate is the eager forward the project's own plain decoding already beats, so it is no such
# reference)
INSTALLED = "installed"
DEPLOYED = ("llama_cpp", "openvino", "onnxruntime")


def parse_engines(entries) -> list[EngineEntry]:
    """eval.engines as entries, each engine and mode known and its package installed (found, not imported);
    `installed` stands for the plain decoding of each deployed engine that is."""
    if entries is None:
        return []
    if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
        raise SpecbenchError(f"eval.engines={entries!r} is invalid: give a list of ENGINE[:MODE] such as "
                             f"[llama_cpp,llama_cpp:prompt_lookup]; engines: {_known()}")
    implied = [n for n in DEPLOYED if not _missing(ENGINES[n])] if INSTALLED in entries else []
    entries = [e for text in entries for e in (implied if text == INSTALLED else [text])]
    out = []
    for text in entries:
        engine, _, mode = text.partition(":")
        kind = ENGINES.get(engine)
        if kind is None or (mode and mode not in kind.modes) or mode == PLAIN:
            raise SpecbenchError(f"eval.engines entry '{text}' is not an engine; valid: {_known()}")
        missing = _missing(kind)
        if missing:
            raise SpecbenchError(f"eval.engines entry '{text}' needs {kind.package}"
                                 f"{' (' + ', '.join(missing) + ')' if missing != [kind.module] else ''}, which is not "
                                 f"installed: {INSTALL}")
        if text in {e.label for e in out}:
            raise SpecbenchError(f"eval.engines lists '{text}' twice")
        out.append(EngineEntry(text, engine, mode or PLAIN, text in implied))
    return out


def _missing(kind: EngineKind) -> list[str]:
    """The imports `kind` needs that are not installed (found, not imported)."""
    return [m for m in (kind.module, *kind.also) if importlib.util.find_spec(m) is None]


def builder(entry: EngineEntry):
    module, _, function = entry.kind.builder.partition(":")
    return getattr(importlib.import_module(module), function)


def _known() -> str:
    return ", ".join([name if mode == PLAIN else f"{name}:{mode}" for name, kind in ENGINES.items()
                      for mode in kind.modes] + [INSTALLED])
