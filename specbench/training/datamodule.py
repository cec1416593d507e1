"""ShareGPT as a LightningDataModule: human-written or self-distilled conversations, padded batches with a mask of
the assistant tokens that supervise the drafter and, for a module that trains on the target's hidden states
(`hidden_states`), those states read from the feature cache. The last `num_val` conversations are the held-out split.

Under DDP, Lightning calls prepare_data in one process per node (then a barrier) and setup in every rank: the
self-distillation responses and the features are generated and cached once, in prepare_data, and every rank reads
the cache."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from specbench.data.prompts import check_prompts, distilled_turns, training_prompts
from specbench.errors import SpecbenchError
from specbench.training.features import FeatureStore, model_fingerprint
from specbench.training.self_distill import cache_file, feature_dir, generate_responses, read_cache, read_responses
from specbench.training.sharegpt import Example, format_conversation


class ShareGPTDataModule(L.LightningDataModule):
    def __init__(self, tokenizer, num_conversations: int = 256, num_val: int = 32, max_length: int = 512,
                 batch_size: int = 4, self_distill: dict | None = None, generator=None,
                 cache_dir: str | Path | None = None, num_workers: int = 0, feature_cache: bool = True) -> None:
        super().__init__()
        if num_conversations <= num_val or num_val < 1:
            raise SpecbenchError(f"train.data needs 1 <= num_val < num_conversations, got num_val={num_val}, "
                                 f"num_conversations={num_conversations}")
        if self_distill is not None and generator is None:
            raise SpecbenchError("self-distillation needs the target to write the responses (generator=...)")
        self.turns = distilled_turns(self_distill)
        check_prompts(self.turns, num_conversations, "train.data.num_conversations")
        if not isinstance(feature_cache, bool):
            raise SpecbenchError(f"train.data.feature_cache={feature_cache!r} is invalid: true (the target's hidden "
                                 f"states computed once, on disk) or false (the module runs the frozen target)")
        # false: the module runs the frozen target each batch, cheaper on a GPU than reading its rows from disk,
        # which for tens of thousands of answers are tens of GB (four states of 576 bf16 values a token)
        self.feature_cache = feature_cache
        self.tokenizer, self.num_conversations, self.num_val = tokenizer, num_conversations, num_val
        self.max_length, self.batch_size = max_length, batch_size
        self.self_distill = None if self_distill is None else dict(self_distill)
        self.generator, self.cache_dir = generator, cache_dir
        if not isinstance(num_workers, int) or num_workers < 0:
            raise SpecbenchError(f"train.data.num_workers={num_workers!r} is invalid: give an integer >= 0 (0 reads "
                                 f"batches in the training process)")
        self.num_workers = num_workers  # on a GPU the batches' feature rows are read beside the steps
        self.store: FeatureStore | None = None
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else tokenizer.eos_token_id

    @property
    def hidden_states(self) -> tuple[int, ...]:
        """The hidden states the feature cache holds for the module being fitted (DrafterModule.hidden_states); ()
        without one, or with the cache off."""
        module = self.trainer.lightning_module if self.trainer is not None and self.feature_cache else None
        return tuple(getattr(module, "hidden_states", ()))

    def _feature_model(self):
        """Who computes missing features: the model that wrote the responses, else the module's frozen target."""
        return self.generator.model if self.generator is not None else self.trainer.lightning_module.backbone

    def _cache(self) -> Path:
        sd = self.self_distill
        return cache_file(Path(self.cache_dir), self.generator.name, max_prompt_tokens=sd["max_prompt_tokens"],
                          max_new_tokens=sd["max_new_tokens"], dtype=sd["dtype"],
                          weights=model_fingerprint(self.generator.model), turns=self.turns)

    def _human_features(self, model) -> Path:
        key = hashlib.sha1(json.dumps({"max_length": self.max_length, "weights": model_fingerprint(model),
                                       "dtype": str(model.dtype)}).encode()).hexdigest()[:10]
        return Path(self.cache_dir) / f"sharegpt-{key}.features"

    def prepare_data(self) -> None:
        if self.self_distill is not None:
            sd = self.self_distill
            generate_responses(self.generator, training_prompts(self.turns, self.num_conversations),
                               self._cache(), sd["max_prompt_tokens"], sd["max_new_tokens"], sd.get("batch_size", 16),
                               self.hidden_states)
        elif self.hidden_states:
            model = self._feature_model()
            sequences = [e.input_ids for e in self._conversations()]
            store = FeatureStore(self._human_features(model), model.config.hidden_size,
                                 model.config.num_hidden_layers, list(map(len, sequences)))
            store.fill(model, sequences, self.hidden_states)

    def _conversations(self) -> list[Example]:
        """The conversations in order, each with its row in the feature store."""
        if self.self_distill is not None:
            return read_responses(self._cache(), self.num_conversations)
        return [replace(format_conversation(self.tokenizer, c, self.max_length), row=i)
                for i, c in enumerate(training_prompts("first", self.num_conversations))]

    def examples(self) -> list[Example]:
        examples = self._conversations()
        if self.hidden_states:  # the store's rows are per whole (untruncated) sequence, in its own order
            model = self._feature_model()
            if self.self_distill is not None:
                root = feature_dir(self._cache())
                lengths = [len(r["prompt"]) + len(r["response"]) for r in read_cache(self._cache())]
            else:
                root, lengths = self._human_features(model), [len(e.input_ids) for e in examples]
            self.store = FeatureStore(root, model.config.hidden_size, model.config.num_hidden_layers, lengths)
            need = max(e.row for e in examples) + 1
            for layer in self.hidden_states:
                if self.store.covered(layer) < need:
                    raise SpecbenchError(f"the feature cache '{root}' holds hidden state {layer} for "
                                         f"{self.store.covered(layer)} of {need} sequences: prepare_data writes it; "
                                         f"delete the folder to recompute")
        return [Example(e.input_ids[: self.max_length], e.loss_mask[: self.max_length], e.row) for e in examples]

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "train_set"):
            return
        examples = self.examples()
        self.train_set = [e for e in examples[: -self.num_val] if sum(e.loss_mask) > 4]
        self.val_set = [e for e in examples[-self.num_val:] if sum(e.loss_mask) > 4]
        if not self.train_set or not self.val_set:
            raise SpecbenchError(f"no usable training sequences among {len(examples)} conversations; raise "
                                 f"train.data.num_conversations or max_length")

    def collate(self, batch: list[Example]) -> dict:
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        loss = torch.zeros((len(batch), width), dtype=torch.bool)
        for i, e in enumerate(batch):
            n = len(e.input_ids)
            ids[i, :n] = torch.tensor(e.input_ids)
            attn[i, :n] = 1
            loss[i, :n] = torch.tensor(e.loss_mask)
        out = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}
        if self.store is not None:  # the target's hidden states at positions 0..n-2 of each sequence (rest: zeros)
            hidden = {}
            for layer in self.hidden_states:
                rows = torch.zeros((len(batch), width, self.store.hidden_size), dtype=torch.bfloat16)
                for i, e in enumerate(batch):
                    rows[i, : len(e.input_ids) - 1] = self.store.read(layer, e.row, len(e.input_ids) - 1)
                hidden[layer] = rows
            out["hidden"] = hidden
        return out

    def _loader(self, examples: list[Example], shuffle: bool) -> DataLoader:
        return DataLoader(examples, batch_size=self.batch_size, shuffle=shuffle, collate_fn=self.collate,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)
