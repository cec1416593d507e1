"""ShareGPT as a LightningDataModule: human-written or self-distilled conversations, padded batches with a mask of
the assistant tokens that supervise the drafter. The last `num_val` conversations are the held-out split.

Under DDP, Lightning calls prepare_data in one process per node (then a barrier) and setup in every rank: the
self-distillation responses are generated and cached once, in prepare_data, and every rank reads the cache."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from specbench.data.sharegpt import read_sharegpt
from specbench.errors import SpecbenchError
from specbench.training.self_distill import cache_file, generate_responses, read_responses
from specbench.training.sharegpt import Example, format_conversation


class ShareGPTDataModule(L.LightningDataModule):
    def __init__(self, tokenizer, num_conversations: int = 256, num_val: int = 32, max_length: int = 512,
                 batch_size: int = 4, self_distill: dict | None = None, generator=None,
                 cache_dir: str | Path | None = None) -> None:
        super().__init__()
        if num_conversations <= num_val or num_val < 1:
            raise SpecbenchError(f"train.data needs 1 <= num_val < num_conversations, got num_val={num_val}, "
                                 f"num_conversations={num_conversations}")
        if self_distill is not None and generator is None:
            raise SpecbenchError("self-distillation needs the target to write the responses (generator=...)")
        self.tokenizer, self.num_conversations, self.num_val = tokenizer, num_conversations, num_val
        self.max_length, self.batch_size = max_length, batch_size
        self.self_distill = None if self_distill is None else dict(self_distill)
        self.generator, self.cache_dir = generator, cache_dir
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else tokenizer.eos_token_id

    def _cache(self) -> Path:
        sd = self.self_distill
        return cache_file(Path(self.cache_dir), self.generator.name, max_prompt_tokens=sd["max_prompt_tokens"],
                          max_new_tokens=sd["max_new_tokens"], dtype=sd["dtype"])

    def prepare_data(self) -> None:
        if self.self_distill is not None:
            sd = self.self_distill
            generate_responses(self.generator, read_sharegpt(self.num_conversations), self._cache(),
                               sd["max_prompt_tokens"], sd["max_new_tokens"], sd.get("batch_size", 16))

    def examples(self) -> list[Example]:
        if self.self_distill is not None:
            examples = read_responses(self._cache(), self.num_conversations)
        else:
            examples = [format_conversation(self.tokenizer, c, self.max_length)
                        for c in read_sharegpt(self.num_conversations)]
        return [Example(e.input_ids[: self.max_length], e.loss_mask[: self.max_length]) for e in examples]

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "train_set"):
            return
        examples = self.examples()
        self.train_set = [e for e in examples[: -self.num_val] if sum(e.loss_mask) > 4]
        self.val_set = [e for e in examples[-self.num_val:] if sum(e.loss_mask) > 4]
        if not self.train_set or not self.val_set:
            raise SpecbenchError(f"no usable training sequences among {len(examples)} conversations; raise "
                                 f"train.data.num_conversations or max_length")

    def collate(self, batch: list[Example]) -> dict[str, torch.Tensor]:
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        loss = torch.zeros((len(batch), width), dtype=torch.bool)
        for i, e in enumerate(batch):
            n = len(e.input_ids)
            ids[i, :n] = torch.tensor(e.input_ids)
            attn[i, :n] = 1
            loss[i, :n] = torch.tensor(e.loss_mask)
        return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, collate_fn=self.collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, collate_fn=self.collate)
