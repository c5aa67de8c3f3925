"""The result cache of ``superoptimize``: JSON entries on disk, one per question —
the program, the configuration, the seed and the device — each holding the answer and
what computed it: the versions of mugraph, torch and triton and the fingerprint of
mugraph's installed code (:func:`mugraph.core.version.code_fingerprint`).

An entry is served only if its question and its versions are those of this call, and
the program inside it is what was asked for; anything else (an answer computed by
other code or other versions, a copy under another key, an edit, a truncation) is
recomputed and replaced with one warning line that says why. The file name is keyed
on the question alone, not the versions: an upgrade finds the old answer under the
same name, says that it was computed by other code, and overwrites it — no stale
entry is served, none is silently orphaned, and the folder does not grow with every
upgrade. Entries are written atomically under unique temporary names, so concurrent
writers cannot collide.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..core.errors import CacheError, MugraphError, SerializationError
from ..core.files import read_json, safe_name, write_text_atomic
from ..core.ir import KernelGraph
from ..core.serialize import graph_to_json
from ..core.version import __version__, code_fingerprint
from .results import Optimized
from .timing import device_name

if TYPE_CHECKING:
    from .optimize import OptimizeConfig

log = logging.getLogger("mugraph")


def versions() -> dict:
    """What computed a result, stored in each cache entry and report: the versions of
    mugraph, torch and triton, and ``"code"``, the fingerprint of mugraph's installed code
    and data (:func:`mugraph.core.version.code_fingerprint`) — the version number alone does not
    change when the search, the verifier or the lowering do."""
    # triton is imported here, not at the top: the lowering imports it inside its
    # interpreter context on a CPU, and triton fixes that mode when first imported
    import triton

    return {"mugraph": __version__, "code": code_fingerprint(), "torch": torch.__version__,
            "triton": triton.__version__}

#: the parts of a cache document that name the question (the file name is keyed on these);
#: the rest (``versions``) says what computed the answer and is compared on read
QUESTION = ("program", "config", "seed", "device")

def cache_doc(program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> dict:
    """Everything a cached result depends on; stored in the entry and compared on use."""
    doc = {"program": graph_to_json(program), "config": config.to_json(), "seed": seed,
           "versions": versions(), "device": device_name(device)}
    return json.loads(json.dumps(doc, sort_keys=True))  # as it reads back from JSON (lists, not tuples)

def cache_key(program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> str:
    """The key of the entry's file name: a hash of the question (:data:`QUESTION`), not of
    the versions — a result computed by other code is found, and replaced, under the same name."""
    return key_of(cache_doc(program, config, seed, device))

def key_of(doc: dict) -> str:
    """The file-name key of a cache document (:func:`cache_doc`): its question only."""
    question = {k: doc.get(k) for k in QUESTION}
    return hashlib.sha256(json.dumps(question, sort_keys=True).encode()).hexdigest()[:24]

def locate(root: Path, program: KernelGraph, config: OptimizeConfig, seed: int, device: str) -> tuple[Path, dict]:
    """The entry's file under ``root`` and the key document it must hold — the lookup
    ``superoptimize`` makes (:func:`cache_doc`, :func:`key_of`, :func:`cache_path`), for the
    torch.compile backend, which asks whether a piece will be served from the cache: one
    key function, so the two cannot disagree."""
    doc = cache_doc(program, config, seed, device)
    return cache_path(root, program, key_of(doc)), doc

def cache_path(root: Path, program: KernelGraph, key: str) -> Path:
    """The entry's file: the program's name made safe (``../../x`` becomes ``x``),
    then the key; always directly inside ``root``."""
    path = root / f"{safe_name(program.name, 48)}-{key}.mug.json"
    if path.parent != root:  # safe_name leaves no separator; checked all the same
        raise CacheError(f"cache entry name {path.name!r} leaves the cache folder")
    return path

def default_cache_dir() -> Path:
    return Path(os.environ.get("MUGRAPH_CACHE_DIR", Path.home() / ".cache" / "mugraph"))

def _short(fp: object) -> str:
    return f"{fp[:12]}…" if isinstance(fp, str) else repr(fp)

def why_stale(stored: object, wanted: dict) -> str | None:
    """Why an entry whose key document is ``stored`` does not answer ``wanted``
    (both :func:`cache_doc`), in words; ``None`` if it does."""
    if stored == wanted:
        return None
    if not isinstance(stored, dict) or any(stored.get(k) != wanted[k] for k in QUESTION):
        return "it was written for another program or configuration"
    old = stored.get("versions") if isinstance(stored.get("versions"), dict) else {}
    new = wanted["versions"]
    parts = []
    if old.get("code") != new["code"]:
        parts.append(f"it was computed by other code (code fingerprint {_short(old.get('code'))} "
                     f"≠ {_short(new['code'])})")
    others = [f"{k} {str(old.get(k))[:20]} ≠ {str(new[k])[:20]}" for k in sorted(new)
              if k != "code" and old.get(k) != new[k]]
    if others:
        parts.append(f"{'and' if parts else 'it was computed'} with other versions ({', '.join(others)})")
    return " ".join(parts) or "its key document differs from the one asked for"

def cached(path: Path, program: KernelGraph, key_doc: dict, *, quiet: bool = False) -> Optimized | None:
    """The entry at ``path`` if it is sound and is the one asked for; else None, with a
    warning line saying why it is recomputed (none with ``quiet``: for a caller that only
    asks whether the next call will be served)."""
    if not path.exists():
        return None
    try:
        doc = read_json(path, "cache")
        why = why_stale(doc.get("cache_key") if isinstance(doc, dict) else None, key_doc)
        if why is None:
            opt = Optimized.from_json(doc)
            if graph_to_json(opt.program) == key_doc["program"]:
                return opt
            why = "the program inside it is not the one asked for"
    except MugraphError as e:
        why = f"it is unreadable ({e})"
    if not quiet:
        log.warning("mugraph cache: recomputing %s: %s", path.name, why[:300])
    return None

def store(path: Path, result: Optimized, key_doc: dict) -> None:
    """Write the entry atomically (unique temporary name, then rename): concurrent
    writers of one key each write a whole file and the last rename wins; then name it in
    its program's structure index (:func:`relatives`). A cache that cannot be written costs
    a warning, never the result."""
    doc = {**result.to_json(), "cache_key": key_doc}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(doc, indent=1), "cache")
        _index(path.parent, key_doc["program"], path.name)
    except (OSError, SerializationError) as e:
        log.warning("mugraph cache: not saved in %s: %s", path.parent, str(e).splitlines()[0][:200])


#: the folder under the cache root that lists, per program structure (:func:`search.transfer.structure_key`),
#: the entries of programs of that structure at any sizes
STRUCTURES = "structures"
#: the most entries one structure's index names (the most recent kept)
MAX_RELATIVES = 16


def _index_path(root: Path, program_doc: dict) -> Path:
    """The index of the structure of the program whose JSON is ``program_doc``."""
    from search.transfer import structure_key_of

    return root / STRUCTURES / f"{structure_key_of(program_doc)}.json"


def _index(root: Path, program_doc: dict, name: str) -> None:
    """Add entry ``name`` to the index of its program's structure (``program_doc``: the
    program's JSON, from the entry's key document; atomically — two writers at once may lose
    one name, which costs a later search a seed, nothing else)."""
    path = _index_path(root, program_doc)
    names = _names(path)
    names = [n for n in names if n != name][-(MAX_RELATIVES - 1):] + [name]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(names), "cache index")


def _names(path: Path) -> list[str]:
    try:
        names = read_json(path, "cache index") if path.exists() else []
    except MugraphError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def relatives(root: Path, key_doc: dict) -> list[KernelGraph]:
    """The best μGraphs cached for programs of the structure of ``key_doc``'s program
    (:func:`cache_doc`) at other sizes, under
    the same configuration (its input strides aside, which follow the sizes), seed, device
    and versions — newest first; programs whose best was the program itself are left out.
    What :func:`search.transfer.transfer` carries to that program's sizes as seeds of its
    search. An entry that cannot be read is skipped."""
    def sized_apart(config: dict) -> dict:
        return {k: v for k, v in config.items() if k != "input_strides"}

    mine = sized_apart(key_doc["config"])

    def same(stored: object) -> bool:
        if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
            return False
        return sized_apart(stored["config"]) == mine and stored.get("program") != key_doc["program"] \
            and all(stored.get(k) == key_doc[k] for k in ("seed", "device", "versions"))

    out = []
    for name in reversed(_names(_index_path(root, key_doc["program"]))):
        entry = root / name
        if entry.parent != root or not name.endswith(".mug.json"):  # an index names entries of its root only
            continue
        try:
            doc = read_json(entry, "cache") if entry.exists() else None
            if isinstance(doc, dict) and same(doc.get("cache_key")):
                best = Optimized.from_json(doc).best
                if best.origin != "program":
                    out.append(best.graph)
        except MugraphError:
            continue
    return out
