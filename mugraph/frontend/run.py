"""Superoptimize the pieces of a captured graph and stitch them back (docs/design.md §10.4).

Each piece is handed to ``mg.superoptimize`` (searched, verified, lowered; results
cached on disk by program — structure and shapes — configuration and device),
and its lowered program becomes a torch operator (:mod:`.kernels`). A piece
whose search raises a mugraph error stays torch code, with one log line saying
why; nothing is silently dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

import lower

from ..core.errors import MugraphError
from ..pipeline.cache import cached, default_cache_dir, locate
from ..pipeline.optimize import make_config, superoptimize
from ..core.files import as_path
from .kernels import make_op
from .options import FrontendOptions
from .pieces import BuiltPiece

log = logging.getLogger("mugraph")

#: (piece name, options key, device, kernel op kind, layout key) -> (operator, Optimized). Why a
#: process-wide table: a torch operator can be registered once per process under its name,
#: and every identical layer of a model captures the same piece — each reuses the first's
#: registration (``None``: its lowering failed)
_DONE: dict[tuple, tuple[Any, Any] | None] = {}
#: (piece name, options key, device, kernel op kind) -> each searched piece's result and what
#: ``bp.info`` says of it (a later capture of the same piece gets a copy). Why: one search per
#: process and piece, whatever the number of identical layers, without reading the disk cache
#: again for each; empty when the search failed
_INFO: dict[tuple, dict] = {}


def _is_cached(bp: BuiltPiece, opts: FrontendOptions, device: str) -> bool:
    """Whether ``superoptimize`` will serve this piece from the cache: the same lookup
    (:func:`~mugraph.pipeline.cache.locate`) and the same checks it makes — an entry computed
    by other code is not a hit, so such a piece is announced and bounded by the deadline as
    the new search it is. Quiet: ``superoptimize`` says why an entry is recomputed, once."""
    if opts.cache_dir is False:
        return False
    root = default_cache_dir() if opts.cache_dir is None else as_path(opts.cache_dir, "cache_dir")
    path, doc = locate(root, bp.program, make_config(opts.optimize_config()), opts.seed, device)
    return cached(path, bp.program, doc, quiet=True) is not None


def optimize_piece(bp: BuiltPiece, opts: FrontendOptions, device: str):
    """``(operator, Optimized)`` for the piece, or ``None`` when it stays torch code.
    The search runs once per process and key; the operator is built only for a piece
    that runs lowered (not for one that ``opts.unfused`` leaves to torch)."""
    kind = opts.kernel_op if opts.kernel_op != "auto" else ("triton_op" if device == "cuda" else "custom_op")
    k = (bp.name, opts.key(), device, kind)
    if k not in _INFO:
        if not _search(bp, opts, device, k):
            return None
    elif not _INFO[k]:  # failed before
        return None
    opt = _INFO[k]["optimized"]
    bp.info = {n: v for n, v in _INFO[k].items() if n != "optimized"}
    if opt.best.origin == "program" and opts.unfused == "torch":
        log.info("mugraph: %s stays torch code: the search found nothing better than the program op by op "
                 "(option unfused='lower' runs it lowered)", bp.name)
        bp.info["runs"] = "torch"
        return None
    kl = k + (bp.layout_key,)  # the same search, compiled for these input strides
    if kl not in _DONE:
        try:
            # no CUDA graph of its own (the caller may capture one around it) and no PDL launch
            # option (wrap_triton passes launch options through only for warps and stages);
            # inputs that are strided views (a transposed weight) are read through their strides,
            # and outputs are written in the layout eager gave them
            configs = {i: lower.KernelConfig.from_dict(v) for i, v in opt.best.configs.items()}
            prog = lower.compile(opt.graph, device=device, configs=configs, cuda_graphs=False, pdl=False,
                                 input_strides=bp.strided, output_strides=bp.strided_outputs)
            suffix = f"_{bp.layout_key}" if bp.layout_key else ""
            _DONE[kl] = (make_op(f"{bp.name}_{opts.key()}_{kind[0]}{suffix}", prog, kind), opt)
        except Exception as e:  # noqa: BLE001 - a piece that fails stays torch code; the model still runs
            _stays_torch(bp, e)
            _DONE[kl] = None
    return _DONE[kl]


def _search(bp: BuiltPiece, opts: FrontendOptions, device: str, k: tuple) -> bool:
    """Superoptimize the piece into ``_INFO[k]``; False (and one log line) when it stays torch code."""
    cached = _is_cached(bp, opts, device)
    if not cached and opts.deadline is not None and time.time() > opts.deadline:
        log.warning("mugraph: %s stays torch code: the deadline for searches has passed", bp.name)
        return False
    if not cached:
        log.info("mugraph: new search for %s, ≤ %g s", bp.describe(), opts.time_limit)
    t0 = time.perf_counter()
    try:
        opt = superoptimize(bp.program, opts.optimize_config(), device=device, cache_dir=opts.cache_dir,
                            progress=False, seed=opts.seed)
    except Exception as e:  # noqa: BLE001 - a piece that fails stays torch code; the model still runs
        _stays_torch(bp, e)
        _INFO[k] = {}
        return False
    _INFO[k] = {"search_s": time.perf_counter() - t0, "cached": cached, "kernels": opt.best.num_kernels,
                "origin": opt.best.origin, "found_by": opt.best.found_by,
                "predicted_s": opt.best.predicted_s, "optimized": opt}
    return True


def _stays_torch(bp: BuiltPiece, e: Exception) -> None:
    what = str(e).splitlines()[0][:300] if str(e) else ""
    log.warning("mugraph: %s stays torch code: %s%s", bp.name,
                "" if isinstance(e, MugraphError) else f"{type(e).__name__}: ", what)


def device_of(example_inputs) -> str:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return "cuda"
    return "cpu"
