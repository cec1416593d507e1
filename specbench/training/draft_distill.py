"""Draft distillation (DistillSpec-style): a shallow same-tokenizer draft learns the target's next-token
distribution by forward KL(p_target || q_draft) on the target's own (self-distilled) responses.

The draft is `shallow_draft`: copies of the target's first N layers and final norm on the shared, frozen embeddings
and LM head, so it starts as the early-exit draft and only N layers train. The target is the frozen teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specbench.errors import SpecbenchError
from specbench.models.distilled_draft import shallow_draft, trained_tensors
from specbench.models.loading import LoadedModel
from specbench.training.base import DrafterModule, RankAccuracy


class DraftDistillModule(DrafterModule):
    def __init__(self, backbone, num_layers: int = 2, lr: float = 1e-3, warmup_ratio: float = 0.05,
                 weight_decay: float = 0.0, export_dtype: str = "bfloat16") -> None:
        super().__init__(backbone, lr, warmup_ratio, weight_decay)
        depth = backbone.config.num_hidden_layers
        if not 1 <= num_layers < depth:
            raise SpecbenchError(f"method.train.module.num_layers={num_layers} is invalid: the draft copies the "
                                 f"target's first layers, so use 1..{depth - 1} (the target has {depth})")
        self.freeze_backbone()
        self.draft = shallow_draft(LoadedModel("target", backbone, tokenizer=None, source="the teacher"),
                                   num_layers).model
        for p in list(self.draft.model.layers.parameters()) + list(self.draft.model.norm.parameters()):
            p.requires_grad_(True)
        self.num_layers, self.export_dtype = num_layers, getattr(torch, export_dtype)
        self.val_acc = RankAccuracy(1)

    def _logits(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft logits, target logits) at the supervised rows: each predicts the token after its position."""
        rows = batch["loss_mask"][:, 1:].nonzero(as_tuple=True)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        lm_head = self.backbone.get_output_embeddings()
        with torch.no_grad():
            teacher = lm_head(self.backbone.model(**inputs).last_hidden_state[:, :-1][rows]).float()
        student = lm_head(self.draft.model(**inputs).last_hidden_state[:, :-1][rows]).float()
        return student, teacher

    @staticmethod
    def _kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        return F.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean")

    def training_step(self, batch, batch_idx):
        student, teacher = self._logits(batch)
        loss = self._kl(student, teacher)
        self.log("train/kl", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        student, teacher = self._logits(batch)
        self.log("val/kl", self._kl(student, teacher), prog_bar=True, sync_dist=True)  # mean over DDP ranks
        self.val_acc.update(0, student, teacher.argmax(-1))  # what greedy verification accepts

    def on_validation_epoch_end(self) -> None:
        self.log("val/top1", self.val_acc.topk(0, 1))
        self.log("val/top5", self.val_acc.topk(0, 5))
        self.rank_accuracy = self.val_acc.rank_probs()
        self.val_acc = RankAccuracy(1)

    def arch(self) -> dict:
        return {"num_layers": self.num_layers, "init": "first layers and final norm of the target"}

    def export_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.to(self.export_dtype) for k, v in trained_tensors(self.draft).items()}
