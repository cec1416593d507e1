"""torch's OpenMP threads, kept from spinning on the cores the OpenVINO runtime's threads run on.

torch's pip wheels run their parallel regions on GNU OpenMP, whose idle workers spin for GOMP_SPINCOUNT iterations
(300,000 by default) before they sleep. Between two OpenVINO calls the loop runs a few small torch ops (the argmax,
the embedding, the cache's bookkeeping); the workers then spin through the next call, on the same two cores as
OpenVINO's threads, and the openvino route's one-row step took longer. A short spin costs the eager forward little,
as its next region mostly follows within it; the deployed route's gain outweighs that cost
(experiments/openvino_engine_speed, openmp_spin.py).
libgomp reads the variable once, when torch loads it, so this module runs as specbench is imported and applies only
where torch was not loaded before it. A user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY stands.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = "1000"
# whether torch's OpenMP threads run with a short (or the user's own) spin: False where torch was loaded before
# specbench with neither variable set, so its workers spin for libgomp's default
SHORT_SPIN = any(v in os.environ for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")) or "torch" not in sys.modules
if "torch" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
