"""records.jsonl: one line per prompt and method, flushed at once, so a killed run loses nothing and a rerun resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


class RecordStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict] = []
        self._done: set[tuple[str, str]] = set()
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            try:
                self.rows.append(json.loads(line))
            except json.JSONDecodeError:
                if i != len(lines) - 1:  # only the last line can be cut by a kill; anything else is corruption
                    raise
                self.path.write_text("".join(l + "\n" for l in lines[:-1]), encoding="utf-8")
        self._done = {(r["method"], str(r["question_id"])) for r in self.rows}

    def has(self, method: str, question_id: str) -> bool:
        return (method, str(question_id)) in self._done

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append(record)
        self._done.add((record["method"], str(record["question_id"])))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)
