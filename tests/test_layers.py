"""The import contracts written in pyproject.toml ([tool.importlinter]) hold: no module imports a layer above it,
no import circles anywhere, and hardware's modelled half never imports its measured half."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_layers_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "3 kept, 0 broken" in proc.stdout
