"""PPD prompt-token training (thesis §4.3): knowledge distillation from the frozen target, only the embeddings train.

For each sequence we pick `cuts_per_sequence` random cut points c inside assistant text (the thesis's random
insertion) and hang a chain of m prompt tokens after token c-1, at positions c..c+m-1. Two passes share one KV
cache: the real tokens once without grad (their logits at c+k-1 are the teacher's distribution of token c+k, exact
because real tokens never see prompt tokens), then all prompt chains with grad on top of it under a mask that lets
chain j see only tokens < c_j and its own earlier prompt tokens. The loss is sum_k alpha^(k-1) KL(teacher || student)/m.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specbench.drafters.ppd import PromptTokens
from specbench.training.base import DrafterModule, RankAccuracy


class PPDModule(DrafterModule):
    needs_tokenizer = True  # the prompt tokens start as the embeddings of init_text

    def __init__(self, backbone, num_prompt_tokens: int = 3, num_ensemble: int = 1, cuts_per_sequence: int = 8,
                 lr: float = 1e-2, warmup_ratio: float = 0.0, weight_decay: float = 0.0, decay: float = 0.8,
                 init_text: str = " next word", tokenizer=None) -> None:
        super().__init__(backbone, lr, warmup_ratio, weight_decay)
        self.freeze_backbone()
        emb = backbone.get_input_embeddings().weight.detach()
        init_ids = tokenizer(init_text, add_special_tokens=False)["input_ids"] if tokenizer is not None else [0]
        self.prompts = PromptTokens(num_prompt_tokens, num_ensemble, emb.shape[1], emb[init_ids].float())
        self.cuts, self.decay = cuts_per_sequence, decay
        self.val_acc = RankAccuracy(num_prompt_tokens)

    def _cut_points(self, mask: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """(B, C) cut points c (prefix = tokens < c) whose labels, tokens c+1..c+m, are all assistant tokens."""
        m, L = self.prompts.num_prompt_tokens, mask.shape[1]
        ok = torch.zeros_like(mask)
        ok[:, 1: L - m] = True  # c >= 1 real token, and the teacher row c+m-1 exists
        for k in range(1, m + 1):
            ok[:, 1: L - m] &= mask[:, 1 + k: L - m + k]
        weights = ok.float() + 1e-9  # a sequence with no valid cut gets masked out below
        cuts = torch.multinomial(weights, self.cuts, replacement=True, generator=generator)
        valid = ok.gather(1, cuts)
        return cuts, valid

    def _forward(self, batch, generator=None):
        """Student logits (B, C, m, V), teacher logits (B, C, m, V) and the (B, C) validity of each cut."""
        ids, attn = batch["input_ids"], batch["attention_mask"]
        m, n_e = self.prompts.num_prompt_tokens, self.prompts.num_ensemble
        cuts, valid = self._cut_points(batch["loss_mask"], generator)
        B, C = cuts.shape
        inner, lm_head = self.backbone.model, self.backbone.get_output_embeddings()
        cache = DynamicCache()
        with torch.no_grad():
            hidden = inner(input_ids=ids, attention_mask=attn, past_key_values=cache, use_cache=True).last_hidden_state
            rows = (cuts[:, :, None] - 1 + torch.arange(1, m + 1, device=ids.device))  # c+k-1 predicts token c+k
            teacher = lm_head(hidden.gather(1, rows.reshape(B, -1, 1).expand(-1, -1, hidden.shape[-1]))).float()
        L = ids.shape[1]
        # prompt rows: cut j, member e, token k -> position c_j - 1 + k, sees real tokens < c_j and its chain so far
        k_idx = torch.arange(m, device=ids.device)
        pos = (cuts[:, :, None, None] + k_idx).expand(B, C, n_e, m).reshape(B, -1)
        n = C * n_e * m
        past = torch.arange(L, device=ids.device)[None, None, :] < cuts.repeat_interleave(n_e * m, 1)[:, :, None]
        past &= attn.bool()[:, None, :]
        chain = torch.block_diag(*[torch.ones(m, m, dtype=torch.bool).tril()] * (C * n_e)).to(ids.device)
        mask = torch.cat([past, chain.expand(B, n, n)], dim=-1)[:, None]
        embeds = self.prompts.weight.transpose(0, 1)  # (n_e, m, d)
        embeds = embeds[None, None].expand(B, C, n_e, m, -1).reshape(B, n, -1).to(hidden.dtype)
        out = inner(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, past_key_values=cache,
                    use_cache=True).last_hidden_state
        student = lm_head(out).float().reshape(B, C, n_e, m, -1).mean(2)  # ensemble: average the logits
        return student, teacher.reshape(B, C, m, -1), valid

    def _loss(self, student, teacher, valid):
        m = student.shape[2]
        loss = 0.0
        for k in range(m):
            s, t = student[:, :, k][valid], teacher[:, :, k][valid]
            kl = F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="batchmean")
            loss = loss + self.decay**k * kl / m
        return loss

    def training_step(self, batch, batch_idx):
        student, teacher, valid = self._forward(batch)
        loss = self._loss(student, teacher, valid)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        gen = torch.Generator(device=batch["input_ids"].device).manual_seed(batch_idx)
        student, teacher, valid = self._forward(batch, gen)
        self.log("val/loss", self._loss(student, teacher, valid), prog_bar=True, sync_dist=True)  # mean over ranks
        for k in range(student.shape[2]):
            self.val_acc.update(k, student[:, :, k][valid], teacher[:, :, k][valid].argmax(-1))

    def on_validation_epoch_end(self) -> None:
        for k in range(self.prompts.num_prompt_tokens):
            self.log(f"val/token{k + 1}_top1", self.val_acc.topk(k, 1))
            self.log(f"val/token{k + 1}_top5", self.val_acc.topk(k, 5))
        self.rank_accuracy = self.val_acc.rank_probs()
        self.val_acc = RankAccuracy(self.prompts.num_prompt_tokens)

    def arch(self) -> dict:
        return {"hidden_size": self.prompts.weight.shape[-1], "num_prompt_tokens": self.prompts.num_prompt_tokens,
                "num_ensemble": self.prompts.num_ensemble}

    def export_tensors(self) -> dict[str, torch.Tensor]:
        return self.prompts.state_dict()
