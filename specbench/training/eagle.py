"""EAGLE-3 training (Li et al. 2025): the one-layer head learns the target's next-token distribution from the
target's own features, unrolled on its own outputs (the training-time test). The target's features come from the
DataModule's feature cache (training/features.py, computed once), so epochs train the head alone.

Row t reads the feature at position t and token t+1 and predicts token t+2. Step 0 reads the target's features, as
the committed rows of a decode do. Step j reads at row t the drafter's step j-1 output at row t-1, as a depth-j draft
node reads its parent's, and sees what that node sees at decode time (ttt_mask): the target-fed rows up to t-j and
its ancestors, row t-j+i of each step i. Step j's loss, weighted decay^j, is the cross-entropy to the target's
distribution over the draft vocabulary, on rows whose label (on self-distilled data the target's top-1) is in it
(EAGLE-3's choice). The draft vocabulary
is the draft_vocab most frequent tokens of the training responses (EAGLE-3's d2t, FR-Spec).

Step j's held-out top-1 accuracy is the probability that a depth-(j+1) draft is accepted given its parent was, so
tau_sim (1 + the sum over depths of the products of those accuracies) is the expected accepted length of a chain.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric
from transformers import DynamicCache

from specbench.drafters.eagle import EagleHead, check_draft_vocab, feature_layers
from specbench.errors import SpecbenchError
from specbench.models.published.eagle import Eagle3Head, draft_config, eagle3_config_for
from specbench.training.base import DrafterModule, RankAccuracy
from specbench.training.sharegpt import Example


def ttt_mask(n: int, step: int) -> torch.Tensor:
    """(n, (step + 1) * n) bool over the keys of steps 0..step: row t sees step 0's rows up to t - step and row
    t - step + i of each step i (its own row when i = step)."""
    t, s = torch.arange(n)[:, None], torch.arange(n)[None]
    return torch.cat([s <= t - step] + [s == t - step + i for i in range(1, step + 1)], dim=1)


def draft_vocabulary(examples: list[Example], vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent supervised tokens, most frequent first (ties and unseen tokens by id)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for e in examples:
        ids = torch.tensor(e.input_ids)[torch.tensor(e.loss_mask, dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)
    return torch.argsort(-counts, stable=True)[:size]


def tau_sim(top1: list[float]) -> float:
    """Expected accepted length (bonus included) of a chain whose depth-k draft is accepted with probability
    top1[k-1] given its parent was."""
    tau, alive = 1.0, 1.0
    for acc in top1:
        alive *= acc
        tau += alive
    return tau


HEADS = ("fc_first", "eagle3")


def build_head(config, head: str, layers: tuple[int, ...], draft_vocab: int):
    """fc_first: specbench's EagleHead (fc mixes feature and embedding, then a target-architecture layer); eagle3:
    EAGLE-3's midlayer head (SafeAILab's, which speculators, vLLM and SGLang run, so task=export can write it)."""
    if head == "fc_first":
        return EagleHead(config, layers, draft_vocab)
    if head == "eagle3" and len(layers) > 1:
        check_draft_vocab(draft_vocab, config.vocab_size)
        return Eagle3Head(draft_config(eagle3_config_for(config), 1), layers, draft_vocab)
    raise SpecbenchError(f"method.head={head!r} is invalid with method.features giving layers {list(layers)}: use "
                         f"{' or '.join(HEADS)}; eagle3 fuses several layers (method.features=fused)")


def projection(head) -> torch.nn.Linear:
    """The head's draft-vocabulary projection (Eagle3Head's lm_head is norm, then proj)."""
    return head.lm_head if isinstance(head.lm_head, torch.nn.Linear) else head.lm_head.proj


class EagleModule(DrafterModule):
    def __init__(self, backbone, features: str = "fused", draft_vocab: int | None = None, ttt_steps: int = 3,
                 lr: float = 1e-3, warmup_ratio: float = 0.05, weight_decay: float = 0.0, decay: float = 0.8,
                 export_dtype: str = "bfloat16", head: str = "fc_first") -> None:
        if not isinstance(ttt_steps, int) or ttt_steps < 1:
            raise SpecbenchError(f"method.train.module.ttt_steps={ttt_steps!r} is invalid: the drafter is unrolled "
                                 f"on its own outputs for that many steps, so give an integer >= 1")
        if export_dtype not in ("float32", "bfloat16", "float16"):
            raise SpecbenchError(f"method.train.module.export_dtype={export_dtype!r} is invalid: use float32, "
                                 f"bfloat16 or float16")
        super().__init__(backbone, lr, warmup_ratio, weight_decay)
        self.freeze_backbone()
        cfg = backbone.config
        self.head_kind = head
        self.head = build_head(cfg, head, feature_layers(cfg.num_hidden_layers, features),
                               draft_vocab or cfg.vocab_size)
        self.hidden_states = tuple(dict.fromkeys(self.head.layers + (-1,)))  # -1: the teacher's last hidden state
        self.features = features
        self.register_buffer("t2d", torch.empty(0, dtype=torch.long), persistent=False)  # target id -> draft id, -1
        self._use_vocabulary(self.head.d2t)
        self.ttt_steps, self.decay, self.export_dtype = ttt_steps, decay, getattr(torch, export_dtype)
        self.val_acc = RankAccuracy(ttt_steps)
        self.val_coverage = MeanMetric()  # share of supervised rows whose target top-1 is in the draft vocabulary

    def _use_vocabulary(self, d2t: torch.Tensor) -> None:
        """Draft ids d2t; the draft head starts as the target's LM head rows of those tokens."""
        vocab = self.backbone.config.vocab_size
        self.head.d2t.copy_(d2t)
        self.t2d = torch.full((vocab,), -1, dtype=torch.long, device=d2t.device)
        self.t2d[d2t] = torch.arange(len(d2t), device=d2t.device)
        projection(self.head).weight.data.copy_(self.backbone.get_output_embeddings().weight.detach()[d2t])

    def setup(self, stage: str) -> None:
        """A reduced vocabulary is chosen from the training responses once per fit, before a resumed fit loads
        its trained head (the vocabulary is not in Lightning checkpoints: it is recomputed the same)."""
        vocab, size = self.backbone.config.vocab_size, projection(self.head).out_features
        if stage == "fit" and size < vocab:
            self._use_vocabulary(draft_vocabulary(self.trainer.datamodule.train_set, vocab, size))

    def unroll(self, batch):
        """Per step j: (j, draft logits, teacher logits, labels) at the supervised rows with a chain start t - j >= 0.
        The teacher is the target's LM head over the draft vocabulary at its cached last hidden state; the labels
        are the data's tokens (the target's own greedy tokens on self-distilled data)."""
        ids, n, hidden = batch["input_ids"], batch["input_ids"].shape[1] - 2, self.target_states(batch)
        rows = batch["loss_mask"][:, 2:].nonzero(as_tuple=True)  # row t predicts token t+2
        dtype = self.head.fc.weight.dtype
        features = torch.cat([hidden[i][:, :n] for i in self.head.layers], dim=-1).to(dtype)
        with torch.no_grad():
            embeds = self.backbone.get_input_embeddings()(ids[:, 1: n + 1]).to(dtype)
            lm_rows = self.backbone.get_output_embeddings().weight[self.head.d2t].to(dtype)
            teacher = F.linear(hidden[-1][:, 1: n + 1][rows].to(dtype), lm_rows).float()
        labels = ids[:, 2:][rows]
        fused = self.head.fuse(features)
        cache, positions = DynamicCache(), torch.arange(n, device=ids.device)[None]
        drafted = fused
        for j in range(self.ttt_steps):
            inputs = fused if j == 0 else torch.cat([fused[:, :1], drafted[:, :-1]], dim=1)  # row 0: no parent
            drafted = self.head(inputs, embeds, attention_mask=ttt_mask(n, j).to(ids.device)[None, None],
                                position_ids=positions, past_key_values=cache)
            keep = rows[1] >= j
            yield j, self.head.lm_head(drafted[rows][keep]).float(), teacher[keep], labels[keep]

    def _cross_entropy(self, logits: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """To the teacher's distribution over the draft vocabulary, on rows whose label is in it."""
        in_vocab = (self.t2d[labels] >= 0).float()
        ce = -(teacher.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        return (ce * in_vocab).sum() / in_vocab.sum().clamp(min=1)

    def training_step(self, batch, batch_idx):
        loss = 0.0
        for j, logits, teacher, labels in self.unroll(batch):
            ce = self._cross_entropy(logits, teacher, labels)
            loss = loss + self.decay**j * ce
            top1 = (self.head.d2t[logits.argmax(-1)] == labels).float().mean()
            self.log(f"train/pos{j + 1}_ce", ce)
            self.log(f"train/pos{j + 1}_top1", top1, batch_size=len(labels))
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        total = 0.0
        for j, logits, teacher, labels in self.unroll(batch):
            total = total + self.decay**j * self._cross_entropy(logits, teacher, labels)
            label = self.t2d[labels]  # as a draft id; -1: outside the draft vocabulary
            if j == 0:
                self.val_coverage.update((label >= 0).float())
            missing = logits.new_full((len(logits), 1), float("-inf"))  # ranks it last, beyond every draft token
            self.val_acc.update(j, torch.cat([logits, missing], dim=1), torch.where(label < 0, logits.shape[1], label))
        self.log("val/loss", total, prog_bar=True, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self.rank_accuracy = self.val_acc.rank_probs()
        top1 = [row[0] for row in self.rank_accuracy]
        for j in range(self.ttt_steps):
            self.log(f"val/pos{j + 1}_top1", top1[j])
            self.log(f"val/pos{j + 1}_top5", self.val_acc.topk(j, 5))
        self.log("val/tau_sim", tau_sim(top1))
        self.log("val/vocab_coverage", self.val_coverage.compute())
        self.val_acc.reset()
        self.val_coverage.reset()

    def arch(self) -> dict:
        """What the drafter rebuilds the head from; an eagle3 head as published EAGLE-3 heads load (`layout`)."""
        cfg = self.backbone.config
        arch = {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "features": self.features,
                "feature_layers": list(self.head.layers), "draft_vocab": projection(self.head).out_features,
                "ttt_steps": self.ttt_steps}
        if self.head_kind == "eagle3":
            arch |= {"layout": "eagle3", "config": eagle3_config_for(cfg)}
        return arch

    def export_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.to(self.export_dtype) if v.is_floating_point() else v for k, v in self.head.state_dict().items()}
