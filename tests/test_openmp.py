"""specbench shortens OpenMP's idle spin as it is imported, where torch has not loaded libgomp yet."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("first, user, expected", [
    ("specbench", {}, "1000 True"),
    ("torch", {}, "None False"),  # libgomp read its default when torch loaded: too late, and the route warns
    ("torch", {"GOMP_SPINCOUNT": "5"}, "5 True"),  # the user's own stands
    ("specbench", {"OMP_WAIT_POLICY": "PASSIVE"}, "None True"),
])
def test_specbench_sets_openmps_spin_only_before_torch_loads_and_never_over_the_users(first, user, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | user
    code = (f"import {first}; import torch, specbench, os; from specbench import openmp; "
            f"print(os.environ.get('GOMP_SPINCOUNT'), openmp.SHORT_SPIN)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == expected.split()
