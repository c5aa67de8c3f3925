"""Emission of the ops that move data in and across the loop: input iterators
(masked loads at the imap/fmap offsets) and accumulators (``acc += x``; a running max
and the sums rescaled to it, ``acc = acc·alpha + x·beta``)."""

from __future__ import annotations

from mugraph.core.ir import RUNNING_MAX, SUM, Op, Tensor, accum_monoid

from ..plan import RunningMax
from .core import Emitter, Val


def tile_indices(em: Emitter, op: Op, order: list[int] | None = None,
                 keep: list[int] | None = None) -> tuple[list[str], list[str]]:
    """Per source dim, the global indices of iterator ``op``'s tile at the grid block's,
    loop step's and sub-tile's offsets (shaped to broadcast in the tile's rank), and the
    masks of the dims padded past their real extent. ``order``: the source dim each dim of
    the tile reads (a permute folded into the load; default: the tile's own). ``keep``: the
    dims of the tile (as read, in ``order``) the indices are shaped for (default: all); a
    unit dim left out is indexed by its offset alone, a scalar (:func:`squeezed_dims`)."""
    t = op.outputs[0]
    pshape, rshape = em.info.padded(t), em.info.shape(t)
    rank = t.ndim
    order = list(range(rank)) if order is None else order
    at = {o: i for i, o in enumerate(keep if keep is not None else range(rank))}
    out_rank = len(at)
    idxs, masks = [""] * rank, []
    for o, d in enumerate(order):
        offs = [f"{v} * {n}" for v, n in em.p.offset_terms(op, d)]
        if o not in at:  # a unit dim left out: its offset, a scalar
            idxs[d] = f"({' + '.join(offs)})" if offs else ""
            continue
        pos = at[o]
        ar = em.r(pshape[d])
        idxs[d] = em.ex(f"({' + '.join(offs)} + {ar})" if offs else ar, pos, out_rank)
        if rshape[d] < pshape[d]:
            masks.append(em.ex(f"({ar} < {rshape[d]})", pos, out_rank))
    return idxs, masks


def squeezed_dims(em: Emitter, op: Op, order: list[int] | None = None) -> list[int] | None:
    """The dims iterator ``op``'s tile (read in ``order``, a folded permute) is loaded in when
    it feeds ``tl.dot`` only: all but its unit dims before the last two — ``None`` when it
    has none. Why: Triton's software pipeliner stages a load into shared memory ahead of the
    ``tl.dot`` that reads it only when nothing but layout changes lie between them; a rank-3
    load of a (1, k, n) tile, reshaped to rank 2 for a dot on ``mma``, was never staged
    (every loop step waited for its loads; Triton 3.6 and 3.9, sm_90 TTGIR: no asynchronous
    copies). Loaded at rank 2 and reshaped back, the two reshapes cancel and the load is
    staged (design §7.5)."""
    pshape = em.info.padded(op.outputs[0])
    rank = len(pshape)
    order = list(range(rank)) if order is None else order
    keep = [o for o, d in enumerate(order) if pshape[d] != 1 or o >= rank - 2]
    return keep if len(keep) < rank else None


def tile_load(em: Emitter, op: Op, cast: str, order: list[int] | None = None, extra: str = "",
              for_dot: bool = False) -> str:
    """The load of iterator ``op``'s tile (read in ``order``, a folded permute), cast by
    ``cast``. ``for_dot``: only ``tl.dot`` reads it, so it is loaded at the dot's rank where
    the tile has leading unit dims (:func:`squeezed_dims`) and reshaped back."""
    keep = squeezed_dims(em, op, order) if for_dot else None
    if keep is None:
        return f"tl.load({load_args(em, op, order)}{extra}){cast}"
    pshape = em.info.padded(op.outputs[0])
    shape = tuple(pshape[d] for d in (order if order is not None else range(len(pshape))))
    return f"tl.reshape(tl.load({load_args(em, op, order, keep)}{extra}){cast}, {shape})"


def load_args(em: Emitter, op: Op, order: list[int] | None = None, keep: list[int] | None = None) -> str:
    """The ``tl.load`` arguments of iterator ``op``'s tile (:func:`tile_indices`), masked
    to the real extents (padding reads as zero)."""
    src = em.src[op.attrs["source"]]
    idxs, masks = tile_indices(em, op, order, keep)
    terms = [i + ("" if src.strides[d] == 1 else f" * {src.strides[d]}") for d, i in enumerate(idxs) if i]
    return f"{src.name}_ptr + {' + '.join(terms)}" + (f", mask={' & '.join(masks)}, other=0.0" if masks else "")


def emit_filled(em: Emitter, out: Tensor, op: Op, order: list[int] | None = None) -> bool:
    """When iterator ``op``'s source is a filled input (:mod:`mugraph.core.fills`), make
    its tile — or ``out``, the tile read in ``order`` (a folded permute) — from its indices
    (fp32, zero in padding) and return True; else emit nothing and return False."""
    src = em.b.sources[op.attrs["source"]]
    if src.fill is None:
        return False
    idxs, masks = tile_indices(em, op, order)
    pad = em.info.padded(op.outputs[0])
    shape = [pad[d] for d in (range(len(pad)) if order is None else order)]
    # the band's expression of rows and keys alone lacks the tile's leading dims: the zeros add them
    made = f"({src.fill.triton(idxs[-2], idxs[-1], src.dtype)} + tl.zeros({shape}, tl.float32))"
    if masks:
        made = f"tl.where({' & '.join(masks)}, {made}, 0.0)"
    v = em.val(out, f32=True, clean=frozenset(range(out.ndim)), finite=True)
    how = "" if order is None else f"permute {tuple(order)} of "
    em.emit(f"{v.name} = {made}  # {how}{src.fill}, made from positions")
    return True


def emit_iterator(em: Emitter, op: Op) -> None:
    """``tl.load`` of the tile (:func:`load_args`); a tile only tensor-core dots read
    stays in its storage dtype, anything else is fp32. A tile the plan loads twice
    (:attr:`lower.plan.KernelPlan.dot_operand_loads`) gets its second load here too. A
    tile only a permute reads is loaded by the permute (:attr:`lower.plan.KernelPlan.load_permutes`)."""
    t = op.outputs[0]
    if op.id in em.p.load_permutes.values():
        return
    if emit_filled(em, t, op):
        return
    src = em.src[op.attrs["source"]]
    rank = t.ndim

    def load(f32: bool, extra: str = "", for_dot: bool = False) -> str:
        return tile_load(em, op, ".to(tl.float32)" if f32 and src.dtype != "float32" else "", extra=extra,
                         for_dot=for_dot)

    f32 = src.dtype == "float32" or t.id not in em.p.dot_only
    v = em.val(t, f32=f32, clean=frozenset(range(rank)), finite=True)
    em.emit(f"{v.name} = {load(f32, for_dot=t.id in em.p.dot_only)}")
    if t.id in em.p.dot_operand_loads:
        # a second load of the same tile for the tl.dot operand's cone: each load gets the
        # layout its users need, instead of a per-step layout conversion (a shared-memory
        # round trip and a barrier); the eviction hint keeps Triton from merging the two
        d32 = em.p.dot_operand_loads[t.id][0] or src.dtype == "float32"
        em.dup_vals[t.id] = Val(f"{v.name}_d", v.pshape, v.rshape, d32, v.clean, True)
        hint = ', eviction_policy="evict_last"'
        em.emit(f"{v.name}_d = {load(d32, hint, for_dot=True)}  # for the tl.dot operand")


def emit_accum(em: Emitter, op: Op) -> None:
    """``acc += x`` each loop step (fp32); ``acc = F·x`` once for a loop-invariant ``x``; the
    un-reduced ``acc_k += x`` for a deferred sum or product (reduced after the loop). A
    running max or a rescaled sum goes through its running maximum (:func:`_emit_online`);
    of an invariant tile, a max is the tile."""
    t = op.outputs[0]
    x = em.vals[op.inputs[0].id]
    if em.p.folds_as(op) != SUM:
        if op in em.p.schedule.invariant_accums:
            v = em.val(t, f32=True, clean=x.clean, finite=x.finite)
            em.emit(f"{v.name} = {em.f32(x)}  # the max of a loop-invariant tile is the tile")
        else:
            _emit_online(em, op, em.p.running_max(op))
        return
    v = em.val(t, f32=True, clean=x.clean, finite=x.finite)
    if op in em.p.schedule.invariant_accums:
        n = em.p.iterations
        em.emit(f"{v.name} = {em.f32(x)}" + (f" * {float(n)!r}" if n != 1 else ""))
    elif op.inputs[0].op.id in em.info.deferred or op.inputs[0].op.id in em.p.deferred_sums:
        em.emit(f"{v.name}_k += {x.name}")
    else:
        em.emit(f"{v.name} += {_step_term(em, op, x, v)}")


def _step_term(em: Emitter, op: Op, x: Val, v: Val) -> str:
    """The term loop accumulator ``op`` (value ``v``) adds each step: ``x``, or for an early
    sum (:attr:`lower.plan.KernelPlan.early_sums`) ``x`` summed along the dim its post-loop
    sum folds — ``v`` then has that dim of size 1, and the sum after the loop is the value
    itself (:func:`lower.emit.reduce.emit_reduce`)."""
    d = em.p.early_sums.get(op.id)
    if d is None:
        return em.f32(x)
    v.pshape = tuple(1 if i == d else n for i, n in enumerate(v.pshape))
    v.rshape = tuple(1 if i == d else n for i, n in enumerate(v.rshape))
    src = em.read_padding(x, [d], "sum")
    src = src if x.f32 else f"({src}).to(tl.float32)"
    em.emit(f"# {v.name}: its sum after the loop taken every step, along dim {d} (lower.plan._early_sums)")
    return f"tl.sum({src}, axis={d}, keep_dims=True)"


def _emit_online(em: Emitter, op: Op, rm: RunningMax) -> None:
    """A running max or a rescaled sum in the loop. The group's first accumulator writes the
    step of its running maximum ``M`` (:class:`lower.plan.RunningMax`): the new maximum, a
    safe shift (0 where the maximum is still −inf — a row with nothing but −inf so far
    scales by ``exp(−inf) = 0``, never by ``exp(−inf + inf) = NaN``), the factors
    ``alpha`` (what was accumulated, onto the new scale) and ``beta`` (this step's terms).
    A rescaled sum is then ``acc·alpha + x·beta``; a running max's value is ``M``.

    Padding: ``M``'s padding is the running max of ``m``'s, finite and zero where ``m``'s
    is; the factors are finite where ``m`` is, so a rescaled sum keeps ``x``'s clean dims."""
    t, m = op.outputs[0], em.vals[rm.shift.id]
    if op is rm.ops[0] and not rm.is_folded:
        n = rm.name
        if not rm.sums:
            em.emit(f"{n} = tl.maximum({n}, {em.f32(m)})  # running max of {rm.shift.label()} over the loop")
        else:
            em.emit(f"# running max of {rm.shift.label()} over the loop: the scale its rescaled sums are kept on")
            _emit_new_max(em, rm, m)
            em.emit(f"{n}_beta = tl.exp({em.f32(m)} - {n}_safe)  # this step's terms")
            em.emit(f"{n} = {n}_new")
    if accum_monoid(op) == RUNNING_MAX:
        v = em.val(t, f32=True, clean=m.clean, finite=m.finite)
        v.name = rm.name
        return
    x = em.vals[op.inputs[0].id]
    v = em.val(t, f32=True, clean=x.clean if m.finite else frozenset(), finite=x.finite and m.finite)
    xt = op.inputs[0]
    deferred = xt.op.id in em.info.deferred or xt.op.id in em.p.deferred_sums
    term = em.f32(x) if deferred else _step_term(em, op, x, v)
    alpha, beta = (scale_to(em, f"{rm.name}_{f}", m, xt.ndim, xt.op.id in em.info.deferred)
                   for f in ("alpha", "beta"))
    acc = f"{v.name}_k" if deferred else v.name
    if not rm.is_folded:
        term = f"{term} * {beta}"
    em.emit(f"{acc} = {acc} * {alpha} + {term}")


def _emit_new_max(em: Emitter, rm: RunningMax, m: Val) -> None:
    """The step's new maximum, its safe form and the factor ``alpha`` onto it."""
    n = rm.name
    em.emit(f"{n}_new = tl.maximum({n}, {em.f32(m)})")
    em.emit(f"{n}_safe = tl.where({n}_new == float('-inf'), 0.0, {n}_new)  # all -inf so far: no NaN")
    em.emit(f"{n}_alpha = tl.exp({n} - {n}_safe)  # what was accumulated, onto the new scale")


def emit_folded_max(em: Emitter, rm: RunningMax) -> Val:
    """A folded running maximum's step (:attr:`lower.plan.RunningMax.folded`), written
    right after its shift tile ``m``: the new maximum first, so the step's exponentials
    are taken against it. Returns the value the folded subs read in place of ``m``:
    the safe new maximum, finite, its padding zero where ``m``'s is."""
    m = em.vals[rm.shift.id]
    n = rm.name
    em.emit(f"# running max of {rm.shift.label()} over the loop, taken first: the step's exponentials are "
            f"shifted by it (its terms need no rescale)")
    _emit_new_max(em, rm, m)
    em.emit(f"{n} = {n}_new")
    return Val(f"{n}_safe", m.pshape, m.rshape, True, clean=m.clean, finite=True)


def scale_to(em: Emitter, expr: str, m: Val, rank: int, unreduced_product: bool) -> str:
    """A per-row scale ``expr`` shaped like shift ``m`` (which broadcasts to ``x``, rank
    ``rank``), as an operand of ``x``'s accumulator: leading unit dims up to ``x``'s rank,
    and a unit k dim before the last when the accumulator holds a matmul's un-reduced
    product (.., m, k, n)."""
    e = em.align(expr, len(m.pshape), rank)
    if unreduced_product:
        e = f"{e}[{', '.join([':'] * (rank - 1) + ['None', ':'])}]"
    return e
