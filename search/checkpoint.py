"""Checkpoints: finished tasks and their results, so an interrupted search resumes
without redoing work and ends with the same result.

The file records the program (as JSON), the result-relevant config fields and,
per finished task index, its verified graphs and statistics. It is rewritten
atomically (write to a temporary file, then rename), so a kill at any moment
leaves either the old or the new checkpoint, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

VERSION = 1


def fingerprint_of(program_json: dict, config_key: dict) -> str:
    blob = json.dumps([program_json, config_key], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class Checkpoint:
    def __init__(self, path: str | os.PathLike, key: str) -> None:
        self.path = Path(path)
        self.key = key
        self.done: dict[int, dict[str, Any]] = {}
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            if doc.get("version") == VERSION and doc.get("key") == key:
                self.done = {int(k): v for k, v in doc["done"].items()}

    def record(self, index: int, results: list[dict], stats: dict) -> None:
        self.done[index] = {"results": results, "stats": stats}

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"version": VERSION, "key": self.key,
                                   "done": {str(k): v for k, v in sorted(self.done.items())}}))
        os.replace(tmp, self.path)
