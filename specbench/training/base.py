"""What every drafter LightningModule shares: a frozen (or LoRA-wrapped) target, checkpoints that hold only the
trainable tensors (a Lightning checkpoint of the 135M backbone would be 0.5 GB per save), a cosine schedule with
warmup, and the trainable share of the target's parameters.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torchmetrics import Metric

from specbench.training.features import state_index


class DrafterModule(L.LightningModule):
    needs_tokenizer: bool = False  # task=train hands the target's tokenizer to modules that declare they need it
    # the target's hidden states (transformers' indices) a module trains on instead of running the frozen target:
    # the DataModule computes them once into its feature cache and every batch carries them as batch["hidden"]
    # (or, with train.data.feature_cache=false, target_states computes them per batch)
    hidden_states: tuple[int, ...] = ()

    def __init__(self, backbone: torch.nn.Module, lr: float, warmup_ratio: float, weight_decay: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.lr, self.warmup_ratio, self.weight_decay = lr, warmup_ratio, weight_decay
        self.strict_loading = False  # checkpoints leave out the frozen backbone
        self.target_params = sum(p.numel() for p in backbone.parameters())

    def target_states(self, batch) -> dict[int, torch.Tensor]:
        """hidden_states for the batch: the feature cache's rows, or one no-grad forward of the frozen target."""
        if "hidden" in batch:
            return batch["hidden"]
        layers = self.backbone.config.num_hidden_layers
        with torch.no_grad():
            out = self.backbone.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      output_hidden_states=tuple(sorted({state_index(h, layers)
                                                                         for h in self.hidden_states})))
        return {h: out.hidden_states[h] for h in self.hidden_states}

    def freeze_backbone(self) -> None:
        for p in self.backbone.parameters():
            p.requires_grad_(False)

    def trainable_share(self) -> tuple[int, float]:
        n = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return n, n / self.target_params

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        keep = {name for name, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}

    def param_groups(self) -> list[dict]:
        return [{"params": [p for p in self.parameters() if p.requires_grad], "lr": self.lr}]

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.param_groups(), lr=self.lr, weight_decay=self.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(total * self.warmup_ratio)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class RankAccuracy(Metric):
    """Counts at which rank of a predicted distribution the label falls: top-k accuracies and tree calibration.

    A torchmetrics Metric: the counts are sum-reduced over DDP ranks before rank_probs/topk read them, so every rank
    reports the accuracy of the whole validation set, not of its own shard."""

    full_state_update = False

    def __init__(self, groups: int, ranks: int = 10) -> None:
        super().__init__()
        self.ranks = ranks
        # last column: rank >= ranks
        self.add_state("hits", default=torch.zeros(groups, ranks + 1, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, group: int, logits: torch.Tensor, labels: torch.Tensor) -> None:
        if labels.numel() == 0:
            return
        label_logit = logits.gather(-1, labels[:, None])
        rank = (logits > label_logit).sum(-1).clamp(max=self.ranks)
        self.hits[group] += torch.bincount(rank.to(self.hits.device), minlength=self.ranks + 1)

    def compute(self) -> torch.Tensor:
        return self.hits

    def rank_probs(self) -> list[list[float]]:
        hits = self.compute()  # synced across ranks (torchmetrics gathers and sums the states here)
        total = hits.sum(-1, keepdim=True).clamp(min=1)
        return (hits[:, : self.ranks] / total).tolist()

    def topk(self, group: int, k: int) -> float:
        return float(sum(self.rank_probs()[group][:k]))
