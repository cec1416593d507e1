"""Medusa-1 and Medusa-2 training (Cai et al. 2024 §2.2, App. B).

Medusa-1: the backbone is frozen and only supplies hidden states; head k learns token t+k+1 with weight decay^k.
Medusa-2: the backbone gets LoRA adapters (peft) and trains jointly, following the paper's self-distillation recipe
(App. B.4): the first `heads_warmup` share of the steps trains the heads alone (a Medusa-1 stage, so their large early
loss does not distort the backbone), then L = L_LM + lambda0(t) * L_medusa with lambda0 ramped up on a sine to its
peak at the end of training. The heads' LR is `lr`; the backbone's is lr / head_lr_mult. L_LM is the KL to the
original model (the same weights with the adapter disabled), the paper's loss for self-distilled data, or plain
cross-entropy on the data (lm_loss=ce).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specbench.drafters.medusa import MedusaHeads
from specbench.errors import SpecbenchError
from specbench.models.artifact import ADAPTER_PREFIX
from specbench.training.base import DrafterModule, RankAccuracy


def sine_ramp(step: int, start: int, total: int, peak: float) -> float:
    """lambda0 at optimizer step `step`: 0 before `start` (heads warm-up), then peak * sin(pi/2 * progress), reaching
    peak at step `total` (the paper's sine schedule, App. B.4)."""
    if step < start:
        return 0.0
    return peak * math.sin(math.pi / 2 * min(1.0, (step - start) / max(1, total - start)))


class MedusaModule(DrafterModule):
    def __init__(self, backbone, num_heads: int = 4, num_layers: int = 1, tie_lm_head: bool = False,
                 lr: float = 1e-3, warmup_ratio: float = 0.1, weight_decay: float = 0.0, decay: float = 0.8,
                 joint: bool = False, lora: dict | None = None, lambda0: float = 0.01, heads_warmup: float = 0.5,
                 head_lr_mult: float = 4.0, lm_loss: str = "kd") -> None:
        if not 0.0 <= heads_warmup < 1.0:
            raise SpecbenchError(f"method.train.module.heads_warmup={heads_warmup!r} is invalid: it is the share of "
                                 f"steps that train the heads alone, in [0, 1)")
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
        self.heads_warmup, self.lora = heads_warmup, dict(lora or {})
        if not joint:  # Medusa-1: the frozen target's last hidden states come from the feature cache
            self.hidden_states = (-1,)
        self.val_acc = RankAccuracy(num_heads)

    @property
    def lm_head(self):
        return self.causal[0].get_output_embeddings()

    def _hidden(self, batch, grad: bool) -> torch.Tensor:
        if not self.joint:
            return self.target_states(batch)[-1].to(self.heads.blocks[0][0].linear.weight.dtype)
        with torch.set_grad_enabled(grad):
            return self.causal[0].model(input_ids=batch["input_ids"],
                                        attention_mask=batch["attention_mask"]).last_hidden_state

    def _head_terms(self, hidden, batch):
        """Per head k: (logits at the supervised rows, labels); position t predicts token t+k+1."""
        ids, mask = batch["input_ids"], batch["loss_mask"]
        for k in range(1, self.heads.num_heads + 1):
            rows = mask[:, k + 1:].nonzero(as_tuple=True)
            h = hidden[:, : -(k + 1)][rows]
            block = self.heads.blocks[k - 1](h)
            logits = self.lm_head(block) if self.heads.proj is None else self.heads.proj[k - 1](block)
            yield k, logits.float(), ids[:, k + 1:][rows]

    def lambda0_at(self, step: int) -> float | None:
        """The Medusa loss weight at `step`; None during the heads warm-up (heads alone, backbone untouched)."""
        total = max(1, int(self.trainer.estimated_stepping_batches))
        start = int(total * self.heads_warmup)
        return None if step < start else sine_ramp(step, start, total, self.lambda0)

    def training_step(self, batch, batch_idx):
        weight = self.lambda0_at(self.global_step) if self.joint else None
        hidden = self._hidden(batch, grad=weight is not None)
        medusa = 0.0
        for k, logits, labels in self._head_terms(hidden, batch):
            ce = F.cross_entropy(logits, labels)
            medusa = medusa + self.decay**k * ce
            self.log(f"train/head{k}_ce", ce)
        loss = medusa
        if weight is not None:
            loss = self._lm_loss(hidden, batch) + weight * medusa
            self.log("train/lambda0", weight)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _teacher_logits(self, batch, rows) -> torch.Tensor:
        """The original model's logits: the same weights with the adapter disabled."""
        with torch.no_grad(), self.backbone.disable_adapter():
            h = self._hidden(batch, grad=False)
            return self.lm_head(h[:, :-1][rows]).float()

    def _lm_loss(self, hidden, batch) -> torch.Tensor:
        rows = batch["loss_mask"][:, 1:].nonzero(as_tuple=True)
        student = self.lm_head(hidden[:, :-1][rows]).float()
        if self.lm_loss == "ce":
            loss = F.cross_entropy(student, batch["input_ids"][:, 1:][rows])
        else:
            teacher = self._teacher_logits(batch, rows)
            loss = F.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean")
        self.log("train/lm_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        hidden = self._hidden(batch, grad=False)
        total = 0.0
        for k, logits, labels in self._head_terms(hidden, batch):
            total = total + self.decay**k * F.cross_entropy(logits, labels)
            self.val_acc.update(k - 1, logits, labels)
        self.log("val/loss", total, prog_bar=True)
        if self.joint:  # Medusa-2: how often the tuned backbone's greedy token is still the original model's
            rows = batch["loss_mask"][:, 1:].nonzero(as_tuple=True)
            tuned = self.lm_head(hidden[:, :-1][rows]).argmax(-1)
            same = (tuned == self._teacher_logits(batch, rows).argmax(-1)).float().mean()
            self.log("val/backbone_agreement", same, batch_size=len(tuned))

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
        return [{"params": heads, "lr": self.lr}] + ([{"params": rest, "lr": self.lr / self.head_lr_mult}] if rest else [])

    def arch(self) -> dict:
        cfg = self.causal[0].config
        arch = {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_heads": self.heads.num_heads,
                "num_layers": len(self.heads.blocks[0]), "tie_lm_head": self.heads.proj is None}
        if self.joint:  # Medusa-2: decoding needs the tuned backbone, rebuilt from this config and the adapter tensors
            arch["lora"] = {k: v for k, v in self.lora.items() if k != "lora_dropout"}
        return arch

    def export_tensors(self) -> dict[str, torch.Tensor]:
        tensors = dict(self.heads.state_dict())
        if self.joint:
            from peft import get_peft_model_state_dict

            tensors |= {ADAPTER_PREFIX + k: v for k, v in get_peft_model_state_dict(self.backbone).items()}
        return tensors
