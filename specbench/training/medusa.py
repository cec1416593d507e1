"""Medusa-1 and Medusa-2 training (Cai et al. 2024 §2.2).

Medusa-1: the backbone is frozen and only supplies hidden states; head k learns token t+k+1 with weight decay^k.
Medusa-2: the backbone gets LoRA adapters (peft) and trains jointly: L = L_LM + lambda0 * L_medusa, heads at
head_lr_mult x the backbone's LR. L_LM is the KL to the original model (the same weights with the adapter disabled),
the paper's recipe for self-distilled data, or plain cross-entropy on the data (lm_loss=ce).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specbench.drafters.medusa import MedusaHeads
from specbench.training.base import DrafterModule, RankAccuracy


class MedusaModule(DrafterModule):
    def __init__(self, backbone, num_heads: int = 4, num_layers: int = 1, tie_lm_head: bool = True,
                 lr: float = 1e-3, warmup_ratio: float = 0.1, weight_decay: float = 0.0, decay: float = 0.8,
                 joint: bool = False, lora: dict | None = None, lambda0: float = 0.2, head_lr_mult: float = 4.0,
                 lm_loss: str = "kd") -> None:
        causal = backbone
        if joint:
            from peft import LoraConfig, get_peft_model

            backbone = get_peft_model(backbone, LoraConfig(**(lora or {})))
        super().__init__(backbone, lr, warmup_ratio, weight_decay)
        if not joint:
            self.freeze_backbone()
        self.causal = [causal]  # the transformers model inside (a list keeps it out of the module tree twice)
        cfg = causal.config
        self.heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads, num_layers, tie_lm_head,
                                 causal.get_output_embeddings().weight.detach())
        self.decay, self.joint, self.lambda0, self.head_lr_mult, self.lm_loss = decay, joint, lambda0, head_lr_mult, lm_loss
        self.val_acc = RankAccuracy(num_heads)

    @property
    def lm_head(self):
        return self.causal[0].get_output_embeddings()

    def _hidden(self, batch) -> torch.Tensor:
        inner = self.causal[0].model
        if self.joint:
            return inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        with torch.no_grad():
            return inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state

    def _head_terms(self, hidden, batch):
        """Per head k: (logits at the supervised rows, labels); position t predicts token t+k+1."""
        ids, mask = batch["input_ids"], batch["loss_mask"]
        for k in range(1, self.heads.num_heads + 1):
            rows = mask[:, k + 1:].nonzero(as_tuple=True)
            h = hidden[:, : -(k + 1)][rows]
            block = self.heads.blocks[k - 1](h)
            logits = self.lm_head(block) if self.heads.proj is None else self.heads.proj[k - 1](block)
            yield k, logits.float(), ids[:, k + 1:][rows]

    def training_step(self, batch, batch_idx):
        hidden = self._hidden(batch)
        medusa = 0.0
        for k, logits, labels in self._head_terms(hidden, batch):
            ce = F.cross_entropy(logits, labels)
            medusa = medusa + self.decay**k * ce
            self.log(f"train/head{k}_ce", ce)
        loss = medusa
        if self.joint:
            loss = self._lm_loss(hidden, batch) + self.lambda0 * medusa
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _lm_loss(self, hidden, batch) -> torch.Tensor:
        rows = batch["loss_mask"][:, 1:].nonzero(as_tuple=True)
        student = self.lm_head(hidden[:, :-1][rows]).float()
        if self.lm_loss == "ce":
            loss = F.cross_entropy(student, batch["input_ids"][:, 1:][rows])
        else:
            with torch.no_grad(), self.backbone.disable_adapter():
                teacher_h = self.causal[0].model(input_ids=batch["input_ids"],
                                                 attention_mask=batch["attention_mask"]).last_hidden_state
                teacher = self.lm_head(teacher_h[:, :-1][rows]).float()
            loss = F.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean")
        self.log("train/lm_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        hidden = self._hidden(batch)
        total = 0.0
        for k, logits, labels in self._head_terms(hidden, batch):
            total = total + self.decay**k * F.cross_entropy(logits, labels)
            self.val_acc.update(k - 1, logits, labels)
        self.log("val/loss", total, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        for k in range(self.heads.num_heads):
            self.log(f"val/head{k + 1}_top1", self.val_acc.topk(k, 1))
            self.log(f"val/head{k + 1}_top5", self.val_acc.topk(k, 5))
        self.rank_accuracy = self.val_acc.rank_probs()
        self.val_acc = RankAccuracy(self.heads.num_heads)

    def param_groups(self) -> list[dict]:
        heads = [p for p in self.heads.parameters() if p.requires_grad]
        head_ids = {id(p) for p in heads}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in head_ids]
        groups = [{"params": heads, "lr": self.lr * (self.head_lr_mult if self.joint else 1.0)}]
        return groups + ([{"params": rest, "lr": self.lr}] if rest else [])

    def arch(self) -> dict:
        cfg = self.causal[0].config
        return {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_heads": self.heads.num_heads,
                "num_layers": len(self.heads.blocks[0]), "tie_lm_head": self.heads.proj is None}

    def export_tensors(self) -> dict[str, torch.Tensor]:
        return self.heads.state_dict()
