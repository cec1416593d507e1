"""The captured forward's fixed cost per transformer layer, measured as the machine profile measures the eager one
(hardware/measured/machine_profile.py, measure_peaks): a one-token step over a 16-token cache of a 2-layer and an
8-layer tiny Llama, the difference per layer. On the graphs backend the step is one graph replay, so what is left per
layer is the graph's own launch gaps and the floor of its small kernels, which the roofline's bound does not see.

    python3 experiments/gpu_graphs/graph_overhead.py OUT.json      (device.sh runs it; CUDA only)
"""

from __future__ import annotations

import json
import sys
import time

import torch

from specbench.execution.graphs import with_graphs
from specbench.models.tiny import tiny_random
from specbench.verification import new_cache

BUDGET_S = 0.5  # of replays per model after the warm-up, as measure_peaks times its forwards


@torch.inference_mode()
def step_seconds(layers: int) -> float:
    """The fastest one-token step (prefilled cache of 16, the step's row cropped again) of a captured tiny Llama."""
    model = with_graphs(tiny_random(num_layers=layers, device="cuda").model)
    cache = new_cache(model)
    ids = torch.zeros(1, 17, dtype=torch.long, device="cuda")
    model(input_ids=ids[:, :16], past_key_values=cache, use_cache=True)

    def step():
        model(input_ids=ids[:, 16:], past_key_values=cache, use_cache=True)
        cache.crop(-1)
    step()  # captures the graphs
    torch.cuda.synchronize()
    best, start, runs = float("inf"), time.perf_counter(), 0
    while runs < 3 or time.perf_counter() - start < BUDGET_S:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        best, runs = min(best, time.perf_counter() - t0), runs + 1
    return best


def main() -> None:
    seconds = {layers: step_seconds(layers) for layers in (2, 8)}
    result = {"step_ms": {str(k): 1e3 * v for k, v in seconds.items()},
              "layer_overhead_ms": max(0.0, 1e3 * (seconds[8] - seconds[2]) / 6)}
    print(json.dumps(result))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
