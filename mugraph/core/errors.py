"""The one error hierarchy of mugraph.

Every problem a user can cause is reported as a subclass of :class:`MugraphError`
with a one-line message that names the culprit (the op, the shape, the rule), so a
bad program never surfaces as a traceback from deep inside numpy, torch or Z3.
"""

from __future__ import annotations


def first_line(e: BaseException, limit: int = 200) -> str:
    """``Type: first line of the message`` (its first ``limit`` characters; blank lines
    skipped): how a log line or a verdict names another library's error in one line."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:limit] if text else ''}"


class MugraphError(Exception):
    """Base class of every error mugraph raises on purpose.

    Its message is always one line: a line break inside it (from a quoted file
    name, a program name, another library's message) is shown as ``" | "``, so a
    log line or the CLI's ``error: …`` never spills over several lines.
    """

    def __str__(self) -> str:
        text = super().__str__()
        if "\n" not in text and "\r" not in text:
            return text
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())


class ShapeError(MugraphError):
    """An op was given tensors whose shapes (or ranks) its shape rule rejects."""


class DTypeError(MugraphError):
    """An unknown dtype, or tensors of different dtypes combined."""


class NotLaxError(MugraphError):
    """The program is outside the Lax fragment (e.g. two ``exp`` on one path)."""


class InvalidGraphError(MugraphError):
    """A μGraph breaks one of the validity rules of docs/design.md §2.7 (the message names it)."""


class ResourceError(MugraphError):
    """A tile or thread graph does not fit its memory (shared memory, registers)."""


class UnsupportedOpError(MugraphError):
    """An op name no catalog entry knows, or an op used at a level it has no meaning at."""


class SerializationError(MugraphError):
    """A file that is not a mugraph JSON document, or one of an unknown version."""


class InputError(MugraphError):
    """Inputs handed to ``evaluate`` (or a compiled program) that do not match the graph."""


class ConfigError(MugraphError):
    """A configuration that asks for something impossible (e.g. zero ops, no time)."""


class CacheError(MugraphError):
    """A cache or saved result that is corrupt, foreign, or from another program."""


class ArgumentTypeError(MugraphError, TypeError):
    """An argument of the wrong Python type (a list where a Tensor goes, a str where
    an int goes). Also a ``TypeError``, so code that guards a call with ``except
    TypeError`` keeps working."""


class ConstantError(MugraphError, ValueError):
    """A scalar constant that is not an exact finite rational mugraph can carry: NaN,
    infinity, a bool, a complex number, a division by the constant 0, or more digits
    than :data:`mugraph.core.limits.MAX_CONSTANT_DIGITS`."""

