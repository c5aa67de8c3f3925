"""The whole-graph rule's outputs check: a form of the graph runs only if it computes what
torch.compile's form computes (docs/models.md, "Never slower").

Each piece is proven equal to its torch ops and its kernels are checked against float64, but
the graph around the pieces is Inductor's: the outlining of repeated layers (design §10.5),
the layouts the pieces are handed, the order of their calls. A fault there would give a model
wrong logits without a word. So before the rule times a form against torch.compile's, both run
once on the call's own inputs and their outputs are compared: a form that gives a NaN or an
infinity where torch.compile's gives a number, or outputs that differ by more than
:data:`MAX_RELATIVE_ERROR`, is refused and the graph runs without it (one warning line).

The bound is loose on purpose: it catches a miscompile, not rounding. A 32-layer bf16 model's
logits under the backend differ from eager's by 5e-2 (relative, Frobenius norm; torch.compile's
by the same), so a bound near that would refuse correct forms; garbage differs by about 1.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from ..core.errors import MugraphError

#: the relative (Frobenius-norm) difference of an output from torch.compile's above which a
#: form of the graph is refused (module docstring)
MAX_RELATIVE_ERROR = 0.25


class FormsDisagree(MugraphError):
    """A form of the graph computes something other than torch.compile's form."""


def disagreement(mine: Any, base: Any) -> str | None:
    """Why outputs ``mine`` differ from ``base`` (torch.compile's), in a few words; None when
    they agree: every floating output finite wherever ``base``'s is, and within
    :data:`MAX_RELATIVE_ERROR` of it where both are."""
    ours, theirs = tree_leaves(mine), tree_leaves(base)
    if len(ours) != len(theirs):
        return f"{len(ours)} outputs where torch.compile's form gives {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if a.shape != b.shape:
            return f"output {i} has shape {tuple(a.shape)}, torch.compile's {tuple(b.shape)}"
        if not (a.is_floating_point() and b.is_floating_point()):
            continue
        a, b = a.detach().double(), b.detach().double()
        finite = torch.isfinite(b)
        bad = int((finite & ~torch.isfinite(a)).sum())
        if bad:
            return f"output {i} {tuple(a.shape)} has {bad} NaN or infinite values where torch.compile's has numbers"
        both = finite & torch.isfinite(a)
        scale = float(b[both].norm())
        err = float((a[both] - b[both]).norm())
        if err > MAX_RELATIVE_ERROR * scale:
            return (f"output {i} {tuple(a.shape)} differs from torch.compile's by {err / max(scale, 1e-30):.2g} "
                    f"(relative), past {MAX_RELATIVE_ERROR}")
    return None


def agreeing(timer: Callable[..., dict]) -> Callable[..., dict]:
    """``timer`` (the whole-graph rule's: ``timer(cap, launches)``, ``launches`` mapping
    ``"mugraph"`` and ``"torch"`` to a form's launch) that first runs each form once and raises
    :class:`FormsDisagree` when the first's outputs disagree with torch's (:func:`disagreement`)."""

    def timed(cap: Any, launches: dict[str, Callable[[], Any]]) -> dict:
        with torch.no_grad():
            why = disagreement(launches["mugraph"](), launches["torch"]())
        if why is not None:
            raise FormsDisagree(why)
        return timer(cap, launches)
    return timed
