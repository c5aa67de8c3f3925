"""Files that cannot hurt: bounded JSON reading, atomic writes, safe file names.

Everything mugraph writes or reads on disk goes through here:

* :func:`read_json` / :func:`loads` parse JSON within :mod:`mugraph.core.limits` (file
  size, nesting depth, length of a number literal), so a hostile document fails
  with a one-line :class:`~mugraph.core.errors.SerializationError` instead of a
  ``RecursionError`` or minutes of big-number parsing.
* :func:`write_text_atomic` writes to a temporary file of a unique name in the
  target folder and renames it into place, so concurrent writers never share a
  temporary name and a reader never sees half a file.
* :func:`safe_name` turns a user-chosen name (a program called ``../../x``) into a
  file name that stays inside the folder it is joined to.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .errors import ArgumentTypeError, SerializationError
from .limits import MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_NUMBER_CHARS

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: files written here get the permissions open() would give them


def safe_name(name: str, max_chars: int = 64) -> str:
    """``name`` as one safe path component: runs of characters other than letters,
    digits, ``_`` and ``-`` (separators and dots included: no ``..``, no hidden files)
    become ``_``, leading and trailing ``_`` are dropped, and it is cut to
    ``max_chars``. Never empty: ``../../x`` is ``x``, ``..`` is ``unnamed``."""
    s = _UNSAFE.sub("_", str(name)).strip("_")[:max_chars]
    return s or "unnamed"


def as_path(path: Any, what: str) -> Path:
    """``path`` (a str or os.PathLike) as a Path, or a one-line error naming ``what``."""
    if isinstance(path, (str, os.PathLike)) and str(path):
        return Path(path)
    raise ArgumentTypeError(f"{what}: expected a file path (str or Path), got {type(path).__name__}")


def write_text_atomic(path: str | Path, text: str, what: str = "write") -> Path:
    """Write ``text`` to ``path`` atomically: a unique temporary file in the same
    folder, flushed, then renamed over ``path``. The folder must exist."""
    path = as_path(path, what)
    folder = path.parent
    if not folder.is_dir():
        raise SerializationError(f"{what}: folder {str(folder)!r} does not exist (create it first)")
    if path.is_dir():
        raise SerializationError(f"{what}: {str(path)!r} is a folder, not a file name")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{safe_name(path.name, 40)}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise SerializationError(f"{what}: cannot write in {str(folder)!r}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it 0600; give it what a plain open() would
        os.replace(tmp, path)
    except OSError as e:
        raise SerializationError(f"{what}: cannot write {str(path)!r}: {e.strerror}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _number(kind: type):
    def parse(s: str):
        if len(s) > MAX_NUMBER_CHARS:
            raise SerializationError(f"a number literal of {len(s)} characters ({s[:20]}...) > {MAX_NUMBER_CHARS} "
                                     "(mugraph.core.limits.MAX_NUMBER_CHARS)")
        return kind(s)
    return parse


_PARSE_INT, _PARSE_FLOAT = _number(int), _number(float)


def loads(text: str, where: str = "document") -> Any:
    """Parse JSON within the limits of :mod:`mugraph.core.limits`; errors name ``where``."""
    if len(text) > MAX_JSON_BYTES:
        raise SerializationError(f"{where}: {len(text)} characters > {MAX_JSON_BYTES} (mugraph.core.limits.MAX_JSON_BYTES)")
    try:
        doc = json.loads(text, parse_int=_PARSE_INT, parse_float=_PARSE_FLOAT)
    except SerializationError as e:
        raise SerializationError(f"{where}: {e}") from None
    except RecursionError:
        raise SerializationError(f"{where}: JSON nested deeper than the parser can follow "
                                 f"(mugraph reads at most {MAX_JSON_DEPTH} levels)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SerializationError(f"{where}: not JSON: {e}") from None
    depth = json_depth(doc)
    if depth > MAX_JSON_DEPTH:
        raise SerializationError(f"{where}: JSON nested {depth} levels deep > {MAX_JSON_DEPTH} "
                                 "(mugraph.core.limits.MAX_JSON_DEPTH)")
    return doc


def json_depth(doc: Any) -> int:
    """Nesting depth of parsed JSON (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            d += 1
            deepest = max(deepest, d)
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def read_json(path: str | Path, what: str = "load") -> Any:
    """Read and parse a JSON file within the limits (size checked before reading)."""
    path = as_path(path, what)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise SerializationError(f"{path}: {size} bytes > {MAX_JSON_BYTES} (mugraph.core.limits.MAX_JSON_BYTES)")
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SerializationError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SerializationError(f"{path}: not JSON: not UTF-8 text ({e.reason})") from None
    return loads(text, str(path))
