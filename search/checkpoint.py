"""Checkpoints: finished tasks and their results, so an interrupted search resumes
without redoing work and ends with the same result.

The file records the program (its name and a hash of its JSON), the result-relevant
config fields (``SearchConfig.key()``) and, per finished unit of work (a root task,
``"7"``, or a piece split off one, ``"7:3.0"``: see :func:`search.units.unit_key`), its
fingerprint matches, statistics and the pieces it handed back (``deferred``), so a
resume re-creates those pieces and redoes no finished one. It is rewritten atomically (a uniquely named temporary file in
the same folder, then a rename), so a kill at any moment leaves either the old or the
new checkpoint, never a torn one.

A checkpoint is used only for the search it was written for: a file written for
another program or config, by other code (the fingerprint of mugraph's installed code,
:func:`mugraph.core.version.code_fingerprint`: another search, verifier or lowering may
enumerate, number or accept the units differently, so resuming would mix two searches'
results), of another format version, or unreadable (truncated, corrupt) is refused
with a one-line :class:`CheckpointError` that says what differs and the way out —
delete the file or pass another path. It is never silently ignored and overwritten
(that would throw away another search's work).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mugraph.core.errors import CacheError
from mugraph.core.version import code_fingerprint

#: 4: a block node's children are numbered among the ops that pass the op checks (shape,
#: labels, abstract expression) — a unit's path of ordinals from version 3 means another node
VERSION = 4


class CheckpointError(CacheError):
    """A checkpoint file that belongs to another search, or cannot be read."""


def fingerprint_of(program_json: dict, config_key: dict) -> str:
    """The hash identifying a search: its program and its result-relevant config. It
    names the default checkpoint file (``superoptimize``) and is what a checkpoint must
    match; the code that wrote the file is checked apart (``Checkpoint.code``), so a
    checkpoint of other code is found under the same name and refused with a message
    that says so, instead of lying orphaned under a name no search asks for."""
    blob = json.dumps([program_json, config_key], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _program_hash(program_json: dict) -> str:
    return hashlib.sha256(json.dumps(program_json, sort_keys=True, default=str).encode()).hexdigest()


class Checkpoint:
    """Finished units of one search (``done``: unit key -> {"results", "stats", "deferred"})."""

    def __init__(self, path: str | os.PathLike, program_json: dict, config_key: dict) -> None:
        self.path = Path(path)
        self.program_name = str(program_json.get("name", ""))
        self.program_hash = _program_hash(program_json)
        self.config = json.loads(json.dumps(config_key, default=str))
        self.key = fingerprint_of(program_json, config_key)
        #: the code searching (:func:`mugraph.core.version.code_fingerprint`); a file written by other
        #: code is not resumed
        self.code = code_fingerprint()
        self.done: dict[str, dict[str, Any]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike, program_json: dict, config_key: dict) -> "Checkpoint":
        """The checkpoint at ``path`` (empty if there is no file); refuses a foreign or unreadable one."""
        ck = cls(path, program_json, config_key)
        if ck.path.exists():
            ck._load()
        return ck

    def _refuse(self, why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {self.path}: {why}; delete it or pass another checkpoint path")

    def _load(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
        except json.JSONDecodeError as e:
            raise self._refuse(f"not valid JSON (truncated or corrupt at character {e.pos})") from None
        except (OSError, UnicodeDecodeError) as e:
            raise self._refuse(f"unreadable ({type(e).__name__}: {e})") from None
        if not isinstance(doc, dict) or doc.get("format") != "mugraph-search-checkpoint":
            raise self._refuse("not a mugraph search checkpoint")
        if doc.get("version") != VERSION:
            raise self._refuse(f"format version {doc.get('version')!r}, this mugraph writes {VERSION}")
        if doc.get("program_hash") != self.program_hash:
            raise self._refuse(f"written for program {doc.get('program')!r}, not for this {self.program_name!r}"
                               if doc.get("program") != self.program_name else
                               f"written for another program named {self.program_name!r}")
        if doc.get("key") != self.key:
            old = doc.get("config") if isinstance(doc.get("config"), dict) else {}
            diff = sorted(k for k in set(old) | set(self.config) if old.get(k) != self.config.get(k))
            what = ", ".join(f"{k}={old.get(k)!r} (now {self.config.get(k)!r})" for k in diff[:3]) or "its key"
            raise self._refuse(f"written for another search config: {what}")
        if doc.get("code") != self.code:
            old_code = doc.get("code")
            was = f"{old_code[:12]}…" if isinstance(old_code, str) else "none recorded"
            raise self._refuse(f"written by other mugraph code (code fingerprint {was} ≠ {self.code[:12]}…), "
                               "whose search may split or accept its work differently")
        try:
            done = doc["done"]
            self.done = {str(k): {"results": list(v["results"]), "stats": dict(v["stats"]),
                                  "deferred": [list(p) for p in v.get("deferred", [])]} for k, v in done.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise self._refuse(f"malformed task records ({type(e).__name__}: {e})") from None

    def record(self, key: str, results: list[dict], stats: dict, deferred: list | None = None) -> None:
        self.done[key] = {"results": results, "stats": stats, "deferred": [list(p) for p in deferred or []]}

    def save(self) -> None:
        doc = {"format": "mugraph-search-checkpoint", "version": VERSION, "key": self.key,
               "program": self.program_name, "program_hash": self.program_hash, "config": self.config,
               "code": self.code,
               "done": dict(sorted(self.done.items()))}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                # one string from the C encoder: json.dump streams through the pure-Python one,
                # several times slower on a checkpoint of thousands of records (saved every few
                # seconds of a search, in the caller's process)
                f.write(json.dumps(doc))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def remove(self) -> None:
        """Delete the file (a finished search's checkpoint has nothing left to resume)."""
        self.path.unlink(missing_ok=True)
