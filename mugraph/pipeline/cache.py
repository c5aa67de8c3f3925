"""The result cache of ``superoptimize``: JSON entries on disk, keyed by the
program, the configuration, the seed, the versions and the device.

An entry stores that key's contents and is served only if they, and the program
inside it, are what was asked for; anything else (a copy under another key, an
edit, a truncation) is recomputed and replaced with a warning. Entries are written
atomically under unique temporary names, so concurrent writers cannot collide.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import CacheError, MugraphError, SerializationError
from ..files import read_json, safe_name, write_text_atomic
from ..ir import KernelGraph
from ..serialize import graph_to_json
from ..version import __version__
from .results import Optimized
from .timing import device_name

if TYPE_CHECKING:
    from .optimize import OptimizeConfig

log = logging.getLogger("mugraph")


def versions() -> dict:
    # triton is imported here, not at the top: the lowering imports it inside its
    # interpreter context on a CPU, and triton fixes that mode when first imported
    import triton

    return {"mugraph": __version__, "torch": torch.__version__, "triton": triton.__version__}

def cache_doc(program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> dict:
    """Everything a cached result depends on; stored in the entry and compared on use."""
    doc = {"program": graph_to_json(program), "config": config.to_json(), "seed": seed,
           "versions": versions(), "device": device_name(device)}
    return json.loads(json.dumps(doc, sort_keys=True))  # as it reads back from JSON (lists, not tuples)

def cache_key(program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> str:
    return key_of(cache_doc(program, config, seed, device))

def key_of(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]

def cache_path(root: Path, program: KernelGraph, key: str) -> Path:
    """The entry's file: the program's name made safe (``../../x`` becomes ``x``),
    then the key; always directly inside ``root``."""
    path = root / f"{safe_name(program.name, 48)}-{key}.mug.json"
    if path.parent != root:  # safe_name leaves no separator; checked all the same
        raise CacheError(f"cache entry name {path.name!r} leaves the cache folder")
    return path

def default_cache_dir() -> Path:
    return Path(os.environ.get("MUGRAPH_CACHE_DIR", Path.home() / ".cache" / "mugraph"))

def cached(path: Path, program: KernelGraph, key_doc: dict) -> Optimized | None:
    """The entry at ``path`` if it is sound and is the one asked for; else None (with
    a warning line saying why it is recomputed)."""
    if not path.exists():
        return None
    try:
        doc = read_json(path, "cache")
        if not isinstance(doc, dict) or doc.get("cache_key") != key_doc:
            why = "it was written for another program or configuration"
        else:
            opt = Optimized.from_json(doc)
            if graph_to_json(opt.program) == key_doc["program"]:
                return opt
            why = "the program inside it is not the one asked for"
    except MugraphError as e:
        why = f"it is unreadable ({e})"
    log.warning("mugraph cache: recomputing %s: %s", path.name, why[:300])
    return None

def store(path: Path, result: Optimized, key_doc: dict) -> None:
    """Write the entry atomically (unique temporary name, then rename): concurrent
    writers of one key each write a whole file and the last rename wins. A cache that
    cannot be written costs a warning, never the result."""
    doc = {**result.to_json(), "cache_key": key_doc}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(doc, indent=1), "cache")
    except (OSError, SerializationError) as e:
        log.warning("mugraph cache: not saved in %s: %s", path.parent, str(e).splitlines()[0][:200])
