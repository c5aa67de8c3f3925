"""Never-slower verdicts kept on disk beside the result cache, so a warm compile does not
time again what its cold compile timed (docs/models.md, "The never-slower rule").

A verdict — a piece's μGraph against its torch ops, or a graph with its μGraph pieces
against the graph without them — depends on what was timed (the piece's program and input
layout, or the graph's code and the call's shapes and strides), the options that made the
μGraph, the GPU and the code that ran. All of it is the entry's question, stored in the
entry and compared on read, as the result cache compares its own (``pipeline.cache``); an
entry that answers another question, or was written by other code or versions, is timed
again and replaced. Only timers that say what they measure (a ``cache_key`` attribute, as
the default GPU timer's) are cached: a caller's own timer is asked every time.

Why: a warm compile of a decoder layer timed every piece both ways again (the torch form
compiled by Inductor for each) and compiled the whole graph twice for its rule; warm
compiles took 2.8–8.3 s on an H200 (how much of that was the timing is not measured)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import MugraphError, SerializationError
from ..core.files import as_path, read_json, safe_name, write_text_atomic
from ..pipeline.cache import default_cache_dir, versions
from ..pipeline.timing import device_name

log = logging.getLogger("mugraph")

#: the folder under the cache directory that holds the verdicts
FOLDER = "verdicts"


def timer_key(timer: Callable) -> str | None:
    """What ``timer`` measures, when it says (its ``cache_key``); None: not cacheable."""
    key = getattr(timer, "cache_key", None)
    return key if isinstance(key, str) and key else None


@dataclass
class Entry:
    """One verdict's place on disk: its file (None: not kept — the cache is off, or the
    timer does not say what it measures) and the question it answers."""

    path: Path | None
    question: dict | None

    def load(self) -> dict | None:
        """The stored verdict, or None (no entry, another question, other code: timed again)."""
        if self.path is None or not self.path.exists():
            return None
        try:
            doc = read_json(self.path, "verdict")
        except MugraphError:
            return None
        if not isinstance(doc, dict) or doc.get("question") != self.question or not isinstance(doc.get("verdict"), dict):
            return None
        return doc["verdict"]

    def save(self, verdict: dict) -> None:
        """Keep ``verdict`` (atomically); one that cannot be written costs a warning line,
        never the compile."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps({"question": self.question, "verdict": verdict}, indent=1),
                              "verdict")
        except (OSError, SerializationError) as e:
            log.warning("mugraph: never-slower verdict not saved in %s: %s", self.path.parent,
                        str(e).splitlines()[0][:200])


def entry(cache_dir: Any, what: str, name: str, subject: Any, options_key: str, device: str,
          timer: Callable) -> Entry:
    """The entry of the verdict on ``subject`` (``what``: "piece" or "graph") under the
    options' cache directory. Its file is named by ``name`` and a hash of the question
    without the versions, so an entry written by other code is found, and replaced, under
    the same name."""
    tk = timer_key(timer)
    if cache_dir is False or tk is None:
        return Entry(None, None)
    doc = {"what": what, "subject": subject, "options": options_key, "device": device_name(device),
           "timer": tk, "versions": versions()}
    doc = json.loads(json.dumps(doc, sort_keys=True, default=str))  # as it reads back from JSON
    root = default_cache_dir() if cache_dir is None else as_path(cache_dir, "cache_dir")
    asked = {k: v for k, v in doc.items() if k != "versions"}
    key = hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:24]
    return Entry(root / FOLDER / f"{safe_name(name, 48)}-{key}.json", doc)
