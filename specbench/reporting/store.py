"""records.jsonl: one line per prompt, turn and method, flushed at once, so a killed run loses nothing and a rerun
resumes where it stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def record_key(record: dict) -> tuple[str, str, int]:
    return record["method"], str(record["question_id"]), int(record.get("turn", 0))


class RecordStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict] = []
        self._done: dict[tuple[str, str, int], dict] = {}
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
        self._done = {record_key(r): r for r in self.rows}

    def get(self, method: str, question_id: str, turn: int = 0) -> dict | None:
        return self._done.get((method, str(question_id), turn))

    def has(self, method: str, question_id: str, turn: int = 0) -> bool:
        return (method, str(question_id), turn) in self._done

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append(record)
        self._done[record_key(record)] = record

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)
