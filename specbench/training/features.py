"""The target's hidden states at every position of the training sequences, computed once and kept on disk, so that
epochs train a drafter head without re-running the frozen 135M backbone (which costs more than the head itself).

One raw bfloat16 file per hidden-state index (transformers' numbering: 0 the embeddings, i after layer i, the last
the final normed state); example i owns rows start[i] .. start[i] + len(i) - 2 of every file (positions 0..len-2: the
last token is never fed). Files grow by appending whole examples, so a file covers a prefix of the examples and an
interrupted run resumes from there; files of different layers may cover different prefixes (a layer first asked for
later is filled by one forward pass over the examples it lacks). numpy memmaps read them (numpy has no bfloat16: the
rows are read as uint16 and viewed as torch.bfloat16).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm


def model_fingerprint(model) -> str:
    """A short hash of the config and a few weight tensors: caches keyed by it are never reused with other weights
    (two tiny random models share a name)."""
    h = hashlib.sha1(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    for p in (model.get_input_embeddings().weight[:64], model.model.layers[0].self_attn.q_proj.weight[:64],
              model.model.norm.weight):
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:10]


def state_index(layer: int, num_layers: int) -> int:
    """transformers' hidden-state index of `layer`: -1 and num_layers name the same state (the final normed one)."""
    return layer % (num_layers + 1)


def feature_rows(length: int) -> int:
    """Feature rows of a sequence of `length` tokens: positions 0..length-2 (the last token is never fed)."""
    return max(length - 1, 0)


class FeatureStore:
    """Appendable per-layer feature files for a fixed sequence of examples (their token counts `lengths`)."""

    def __init__(self, root: Path, hidden_size: int, num_layers: int, lengths: list[int]) -> None:
        self.root, self.hidden_size, self.num_layers = Path(root), hidden_size, num_layers
        self.lengths = list(lengths)
        rows = [feature_rows(n) for n in self.lengths]
        self.start = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]) if rows else np.zeros(1, np.int64)
        self._maps: dict[int, np.memmap] = {}

    def index(self, layer: int) -> int:
        return state_index(layer, self.num_layers)

    def path(self, layer: int) -> Path:
        return self.root / f"hidden{self.index(layer)}.bf16"

    def extend(self, lengths: list[int]) -> None:
        """More examples after the known ones (the self-distillation cache grew)."""
        self.lengths += list(lengths)
        rows = np.array([feature_rows(n) for n in lengths], dtype=np.int64)
        self.start = np.concatenate([self.start, self.start[-1] + np.cumsum(rows)])

    def _rows(self, layer: int) -> int:
        path = self.path(layer)
        return path.stat().st_size // (2 * self.hidden_size) if path.exists() else 0

    def covered(self, layer: int) -> int:
        """How many examples (a prefix) the layer's file holds whole."""
        return int(np.searchsorted(self.start, self._rows(layer), side="right") - 1)

    def trim(self) -> None:
        """Cut every file back to the whole examples it holds (a crash between the features and the record that
        owns them leaves extra rows, which must not pass for the next example's)."""
        for path in self.root.glob("hidden*.bf16"):
            layer = int(path.name.removeprefix("hidden").removesuffix(".bf16"))
            keep = int(self.start[self.covered(layer)]) * 2 * self.hidden_size
            if path.stat().st_size != keep:
                with path.open("r+b") as fh:
                    fh.truncate(keep)
            self._maps.pop(layer, None)

    def append(self, hidden: dict[int, torch.Tensor]) -> None:
        """Rows for the next example of each file (its feature_rows), one (rows, hidden_size) tensor per layer."""
        self.root.mkdir(parents=True, exist_ok=True)
        for layer, rows in hidden.items():
            data = rows.detach().to(torch.bfloat16).contiguous().view(torch.uint16).cpu().numpy()
            with self.path(layer).open("ab") as fh:
                fh.write(data.tobytes())
            self._maps.pop(self.index(layer), None)

    def read(self, layer: int, example: int, rows: int) -> torch.Tensor:
        """(rows, hidden_size) bfloat16: the first `rows` feature rows of an example."""
        key = self.index(layer)
        if key not in self._maps:
            self._maps[key] = np.memmap(self.path(layer), dtype=np.uint16, mode="r").reshape(-1, self.hidden_size)
        start = int(self.start[example])
        return torch.from_numpy(np.array(self._maps[key][start: start + rows])).view(torch.bfloat16)

    @torch.inference_mode()
    def fill(self, model, sequences: list[list[int]], layers, batch_size: int = 8) -> None:
        """Append the features every file of `layers` lacks for `sequences` (this store's examples, in order), from
        forwards of `model` (a transformers causal LM) over the whole sequences, right-padded."""
        layers = sorted({self.index(layer) for layer in layers})
        self.trim()
        todo = {layer: self.covered(layer) for layer in layers}
        first = min(todo.values(), default=len(sequences))
        if first >= len(sequences):
            return
        bar = tqdm(total=len(sequences), initial=first, desc="target features", unit="sequence", dynamic_ncols=True)
        device = model.get_input_embeddings().weight.device
        for begin in range(first, len(sequences), batch_size):
            batch = sequences[begin: begin + batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([s + [0] * (width - len(s)) for s in batch], device=device)
            attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch], device=device)
            out = model.model(input_ids=ids, attention_mask=attn, output_hidden_states=tuple(layers))
            for row, seq in enumerate(batch):
                example = begin + row
                self.append({layer: out.hidden_states[layer][row, : feature_rows(len(seq))]
                             for layer in layers if todo[layer] <= example})
            bar.update(len(batch))
        bar.close()
