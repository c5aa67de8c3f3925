"""Online softmax lowered: accumulators over a monoid (docs/design.md §7.14).

A running max (``BlockGraph.accum_max``) and the sums rescaled to it
(``BlockGraph.accum(x, shift=m)``) become an fp32 running maximum in registers with one
``acc·alpha + x·beta`` update per accumulator and step. Checked against the float64
interpreter at logits large enough (scores ×30) that an exponential without the shift
overflows fp16, in fp16 and fp32: the one-kernel form, the
split (flash-decoding) form of two kernels, and an attention-shaped μGraph (Q per block,
Kᵀ and V walked by the loop); split-K across programs (a rescaled combine), both
combines, deferred sums and un-reduced products; re-chunking refused by name; random
μGraphs with online accumulators at random split-K and sub-tile configs. CPU only
(Triton interpreter)."""

from __future__ import annotations

import math

import pytest
import torch

import lower
import mugraph as mg
from lower import cost_model
from lower.config import KernelConfig, KernelConfigError
from lower.plan import plan
from lower.profile import layout_choices
from lower.testing import check
from lower.tiles import loop_chunks

from online_graphs import attention_ugraph

TOL = {"float32": 1e-4, "float16": 2e-2}
LOGIT_SCALE = 30.0


def _online(rows: int, keys: int, d: int, steps: int, dtype: str, post_max: bool = False) -> mg.KernelGraph:
    """One kernel (as ``tests/verify/test_online.py``'s): the loop walks the keys; per step
    m = max(s_i), e = exp(s_i − m); Σe and e @ v accumulated rescaled by m."""
    g = mg.KernelGraph("online")
    s, v = g.input("s", (rows, keys), dtype), g.input("v", (keys, d), dtype)
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=steps)
    st, vt = bg.input(s, (None, None, None), 1), bg.input(v, (None, None, None), 0)
    m = mg.max(st, 1)
    e = mg.exp(st - m)
    out = bg.accum(e @ vt, m) / bg.accum(mg.sum(e, 1), m)
    if post_max:  # the running max read after the loop
        out = out + bg.accum_max(m)
    bg.output(out, (None, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


def _split(rows: int, keys: int, d: int, chunks: int, steps: int, dtype: str) -> mg.KernelGraph:
    """Two kernels (flash-decoding): per chunk of the keys the online kernel writes its
    partial numerator, denominator and running max; the combine loops over the chunks
    with the same rescaled accumulators."""
    g = mg.KernelGraph("split")
    s, v = g.input("s", (rows, keys), dtype), g.input("v", (keys, d), dtype)
    b1 = mg.BlockGraph(grid=(chunks, 1, 1), forloop=steps)
    loop = steps > 1
    st = b1.input(s, (1, None, None), 1 if loop else None)
    vt = b1.input(v, (0, None, None), 0 if loop else None)
    m = mg.max(st, 1)
    e = mg.exp(st - m)
    b1.output(b1.accum(e @ vt, m), (1, None, None))
    b1.output(b1.accum(mg.sum(e, 1), m), (1, None, None))
    b1.output(b1.accum_max(m), (1, None, None))
    num, den, mx = g.kernel(b1)
    b2 = mg.BlockGraph(grid=(1, 1, 1), forloop=chunks)
    nt, dt, mt = (b2.input(t, (None, None, None), 1) for t in (num, den, mx))
    b2.output(b2.accum(nt, mt) / b2.accum(dt, mt), (None, None, None))
    (o,) = g.kernel(b2)
    g.output(o)
    return g


def _inputs(g: mg.KernelGraph, seed: int, large: tuple[str, ...] = ("s", "q")) -> dict[str, torch.Tensor]:
    """Standard normal inputs in the graph's dtypes, the logits' side ×30."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for t in g.inputs:
        x = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        out[t.name] = (x * (LOGIT_SCALE if t.name in large else 1.0)).to(getattr(torch, t.dtype))
    return out


def _kernels(g: mg.KernelGraph) -> list:
    return [op for op in g.ops if op.kind == "graph_defined"]


def _run(g: mg.KernelGraph, labels, seed: int = 0) -> list[float]:
    """Lower ``g`` with a config per kernel (a label, or one label for every kernel), run
    it on inputs whose logits overflow an unshifted exp, compare with float64."""
    ops = _kernels(g)
    labels = [labels] * len(ops) if isinstance(labels, str) else labels
    configs = {op.id: KernelConfig.from_label(lab) for op, lab in zip(ops, labels)}
    prog = lower.compile(g, device="cpu", configs=configs, poison=True)
    return check(prog, g, _inputs(g, seed))


def test_the_logits_overflow_an_unshifted_exp():
    s = _inputs(_online(4, 64, 8, 4, "float16"), 0)["s"].double()
    assert s.max().item() > 12  # exp overflows fp16 above 11.1
    assert (s.amax(1) > 12).all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", [(4, 64, 8, 4), (12, 96, 16, 4)], ids=["4x64", "12x96"])
@pytest.mark.parametrize("label", ["w4s2", "w4s2r", "w2s2v", "w4s3k2", "w4s3k2Lva"])
def test_the_online_form_matches_float64(shape, dtype, label):
    rows, keys, d, steps = shape
    errs = _run(_online(rows, keys, d, steps, dtype, post_max=label == "w4s3k2"), label)
    assert max(errs) <= TOL[dtype], (shape, dtype, label, errs)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("chunks, steps, labels", [(2, 2, "w4s2"), (3, 2, ("w4s2", "w4s2k3L")),
                                                   (4, 1, ("w4s2", "w4s2k2"))],
                         ids=["2x2", "3x2-combine-split", "4x1-invariant"])
def test_the_split_form_matches_float64(chunks, steps, labels, dtype):
    """Per-chunk partials saved with their running max (a max of a loop-invariant tile
    where a chunk is one step), combined by a second kernel — itself split-K below."""
    g = _split(12, 96, 8, chunks, steps, dtype)
    errs = _run(g, labels)
    assert max(errs) <= TOL[dtype], (chunks, steps, labels, dtype, errs)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("label, sub", [("w4s2", False), ("w4s2k3L", False), ("w4s3", True)],
                         ids=["default", "splitK-last", "sub-tiles"])
def test_attention_matches_float64(dtype, label, sub):
    """Rows not a power of two (24 per block, padded to 32), keys in 3 steps of 32;
    ``sub``: the output's first parallel class cut in two sub-tiles."""
    g = attention_ugraph(2, 24, 96, 16, 3, dtype)
    cfg = KernelConfig.from_label(label)
    if sub:
        info = plan(_kernels(g)[0].attrs["block"]).info
        cfg = KernelConfig(num_warps=cfg.num_warps, num_stages=cfg.num_stages, sub=((info.parallel[0], 2),))
    errs = _run(g, cfg.label())
    assert max(errs) <= TOL[dtype], (dtype, cfg.label(), errs)


def _terms(kind: str, dtype: str = "float32") -> mg.KernelGraph:
    """``_online``'s kernel with the summed terms changed: ``"linear"`` (e@v scaled, plus
    a second product — linear in e), ``"affine"`` (e@v + v: not linear in e),
    ``"squared"`` (Σ e²: not linear), ``"plain"`` (Σ e also summed without a rescale:
    its value depends on the shift)."""
    g = mg.KernelGraph(kind)
    s, v = g.input("s", (12, 96), dtype), g.input("v", (96, 16), dtype)
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=3)
    st, vt = bg.input(s, (None, None, None), 1), bg.input(v, (None, None, None), 0)
    m = mg.max(st, 1)
    e = mg.exp(st - m)
    num = e @ vt
    den = mg.sum(e, 1)
    if kind == "linear":
        num = mg.scale(num, 0.5) + (e * st) @ vt
    elif kind == "affine":
        num = num + mg.sum(vt, 0)
    elif kind == "squared":
        den = mg.sum(e * e, 1)
    bg.output(bg.accum(num, m) / bg.accum(den, m), (None, None, None))
    if kind == "plain":
        bg.output(bg.accum(mg.sum(e, 1)), (None, None, None))
    for o in g.kernel(bg):
        g.output(o)
    return g


@pytest.mark.parametrize("kind, folds", [("linear", True), ("affine", False), ("squared", False),
                                         ("plain", False)])
@pytest.mark.parametrize("label", ["w4s2", "w4s2k3L", "w4s2va"])
def test_the_shift_folds_only_where_the_terms_are_linear_in_the_exponentials(kind, folds, label):
    """Folded (:func:`lower.plan._folded_shifts`): the step's exponentials taken against
    the new running maximum, no ``beta`` factor in the code. Terms not linear in the
    exponentials, or an exponential read elsewhere, keep ``acc·alpha + x·beta``. Both
    match float64, logits ×30."""
    g = _terms(kind)
    p = plan(_kernels(g)[0].attrs["block"], KernelConfig.from_label(label))
    (rm,) = p.running_maxes
    assert rm.is_folded == folds
    prog = lower.compile(g, device="cpu", configs={_kernels(g)[0].id: KernelConfig.from_label(label)}, poison=True)
    assert ("_beta" not in prog.triton_source()) == folds
    assert max(check(prog, g, _inputs(g, 3))) <= TOL["float32"], (kind, label)


def test_an_early_sum_of_a_loaded_half_precision_tile_adds_up_in_fp32():
    """The loaded fp16 tile summed every step (``lower.plan._early_sums``) is widened to fp32
    first, as every sum is: against float64, positive scores so no cancellation hides it."""
    g = _summed_after(48, 240, 3, rescaled=False, dtype="float16", loaded=True)
    op = _kernels(g)[0]
    cfg = KernelConfig.from_label("w2s2")
    assert plan(op.attrs["block"], cfg).early_sums
    prog = lower.compile(g, device="cpu", configs={op.id: cfg}, poison=True)
    inputs = {k: v.abs() + 0.5 for k, v in _inputs(g, 6, large=()).items()}
    assert max(check(prog, g, inputs)) <= TOL["float16"]


def test_the_fold_can_be_switched_off_for_measuring_it():
    """``KernelConfig.fold_shifts=False`` (label suffix ``N``) keeps ``beta``; same values."""
    g = attention_ugraph(2, 24, 96, 16, 3, "float32")
    for label, folds in (("w4s2", True), ("w4s2N", False)):
        cfg = KernelConfig.from_label(label)
        assert cfg.label() == label and cfg.fold_shifts == folds
        prog = lower.compile(g, device="cpu", configs={_kernels(g)[0].id: cfg}, poison=True)
        assert ("_beta" not in prog.triton_source()) == folds
        assert max(check(prog, g, _inputs(g, 5))) <= TOL["float32"], label


def test_attention_folds_its_shift():
    """Attention's and the split form's kernels take their exponentials against the
    running maximum (the other tests above then check them against float64); the split
    form's combine, which exponentiates nothing, keeps its factors."""
    for g in (attention_ugraph(2, 24, 96, 16, 3, "float16"), _split(12, 96, 8, 2, 2, "float16"),
              _online(4, 64, 8, 4, "float16", post_max=True)):
        folded = [rm.is_folded for op in _kernels(g) for rm in plan(op.attrs["block"]).running_maxes if rm.sums]
        assert folded == ([True, False] if g.name == "split" else [True]), g.name


def _summed_after(rows: int, keys: int, steps: int, rescaled: bool = True, dtype: str = "float32",
                  loaded: bool = False) -> mg.KernelGraph:
    """The exponentials accumulated whole and summed after the loop (a form the search
    finds): ``accum(e, m)`` then ``sum(·, 1)``; ``rescaled=False``: a plain ``accum(x)``
    of the squared scores then its sum; ``loaded``: of the loaded tile itself (held in its
    storage dtype)."""
    g = mg.KernelGraph("summed_after")
    s, v = g.input("s", (rows, keys), dtype), g.input("v", (keys, 8), dtype)
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=steps)
    st, vt = bg.input(s, (0, None, None), 1), bg.input(v, (None, None, None), 0)
    if rescaled:
        m = mg.max(st, 1)
        e = mg.exp(st - m)
        out = bg.accum(e @ vt, m) / mg.sum(bg.accum(e, m), 1)
    else:
        out = bg.accum(st @ vt) / mg.sum(bg.accum(st if loaded else mg.square(st)), 1)
    bg.output(out, (0, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


@pytest.mark.parametrize("rescaled", [True, False], ids=["rescaled", "plain"])
@pytest.mark.parametrize("label, early", [("w2s2", True), ("w8s2", False), ("w2s2k3", False)])
def test_a_sum_after_the_loop_is_taken_every_step_when_its_tile_is_large(rescaled, label, early):
    """``lower.plan._early_sums``: an accumulator whose only use is a sum after the loop,
    its tile (48 rows of 2 blocks, 80 keys a step: 32 × 128 padded) above 32 fp32
    registers a thread — with 2 warps, not with 8 — is summed every step, the sum after
    the loop is the accumulator; not under split-K. All match float64."""
    g = _summed_after(48, 240, 3, rescaled)
    op = _kernels(g)[0]
    p = plan(op.attrs["block"], KernelConfig.from_label(label))
    assert bool(p.early_sums) == early, p.early_sums
    prog = lower.compile(g, device="cpu", configs={op.id: KernelConfig.from_label(label)}, poison=True)
    assert ("along dim 1 (lower.plan._early_sums)" in prog.triton_source()) == early
    assert max(check(prog, g, _inputs(g, 4))) <= TOL["float32"], label


def test_a_row_of_minus_inf_shifts_gives_zero_not_nan():
    """The safe shift: a row whose shift is −inf in every step accumulates nothing (0);
    a row −inf in some steps only rescales those to 0, as the interpreter does."""
    g = mg.KernelGraph("masked")
    s, x = g.input("s", (6, 48), "float32"), g.input("x", (6, 48), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=3)
    st, xt = bg.input(s, (None, None, None), 1), bg.input(x, (None, None, None), 1)
    bg.output(bg.accum(xt, mg.max(st, 1)), (None, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    inputs = _inputs(g, 1, large=("s",))
    inputs["s"][0] = -math.inf          # every step
    inputs["s"][1, :16] = -math.inf     # the first step only
    inputs["s"][2, 16:32] = -math.inf   # a middle step
    for label in ("w4s2", "w4s2k3", "w4s2k3L"):
        prog = lower.compile(g, device="cpu", configs={_kernels(g)[0].id: KernelConfig.from_label(label)})
        got = prog(**inputs)
        assert torch.isfinite(got).all() and (got[0] == 0).all(), label
        (ref,) = mg.evaluate(g, {k: v.double() for k, v in inputs.items()})
        ref = torch.as_tensor(ref)
        assert torch.allclose(got[1:].double(), ref[1:], rtol=1e-5, atol=1e-6), label


@pytest.mark.parametrize("label", ["w4s2", "w4s2k2", "w4s2k2L"])
def test_running_maxima_alone_and_of_invariant_tiles(label):
    """A running max saved as it is (10 rows, padded to 16); the max of a loop-invariant
    tile (the tile: split-K programs' copies combined by max, not summed); a sum rescaled by
    an invariant shift (every factor 1: a plain sum)."""
    g = mg.KernelGraph("maxima")
    s, q = g.input("s", (10, 64), "float32"), g.input("q", (10, 3), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=4)
    st, qt = bg.input(s, (None, None, None), 1), bg.input(q, (None, None, None), None)
    qm = mg.max(qt, 1)
    bg.output(bg.accum_max(mg.max(st, 1)), (None, None, None))
    bg.output(bg.accum_max(qm) + bg.accum(mg.sum(st, 1), qm), (None, None, None))
    running, invariant = g.kernel(bg)
    g.output(running)
    g.output(invariant)
    errs = _run(g, label)
    assert max(errs) <= TOL["float32"], (label, errs)


def test_rechunking_is_refused_by_name_and_not_offered():
    b = _kernels(_online(4, 64, 8, 8, "float32"))[0].attrs["block"]
    assert loop_chunks(plan(b).info) == [1]
    with pytest.raises(KernelConfigError, match=r"re-chunked by 2: accumulator \w+ \(block op \d+\) is a sum "
                                                r"rescaled to a running max"):
        plan(b, KernelConfig(chunk=2))
    layouts = layout_choices(b, small_mm=("dot", "v", "va"))
    assert {ch for _, _, ch, _, _ in layouts} == {1}
    assert {s for s, *_ in layouts} == {1, 2, 4, 8} and {mm for *_, mm in layouts} == {"dot", "v", "va"}


def test_the_cost_model_prices_the_rescale():
    """A rescaled sum costs its sum plus the running max's exp/max work per step; the
    split form's partial maxima are partials too."""
    rescaled = _online(16, 256, 16, 8, "float16")
    plain = mg.KernelGraph("plain")
    s, v = plain.input("s", (16, 256), "float16"), plain.input("v", (256, 16), "float16")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=8)
    st, vt = bg.input(s, (None, None, None), 1), bg.input(v, (None, None, None), 0)
    e = mg.exp(st - mg.max(st, 1))
    bg.output(bg.accum(e @ vt) / bg.accum(mg.sum(e, 1)), (None, None, None))
    (o,) = plain.kernel(bg)
    plain.output(o)
    for cfg in (KernelConfig(), KernelConfig(split=4), KernelConfig(split=4, combine="last", small_mm="va")):
        a = cost_model.breakdown(rescaled, configs={_kernels(rescaled)[0].id: cfg})
        b = cost_model.breakdown(plain, configs={_kernels(plain)[0].id: cfg})
        assert math.isfinite(a.total) and a.launches[0].flops > b.launches[0].flops, cfg.label()
    split = _split(12, 96, 8, 2, 2, "float16")
    assert math.isfinite(cost_model.estimate(split, configs={op.id: KernelConfig(split=2) for op in _kernels(split)}))


def test_the_tuners_choice_runs():
    """Without a GPU the tuner returns the cost model's choice among the layouts it offers."""
    g = attention_ugraph(2, 24, 96, 16, 3, "float16")
    best = lower.profile(g)
    prog = lower.compile(g, device="cpu", configs=best.configs, poison=True)
    assert max(check(prog, g, _inputs(g, 2))) <= TOL["float16"]


def test_random_online_ugraphs_with_random_configs():
    """Random μGraphs of the lowering's profile with online accumulators drawn often
    (``mugraph.core.randgraph.ONLINE_LOWERING``: sums rescaled to the running max of any
    body tile that broadcasts to them, running maxima kept), at the default config and at a
    random split-K / sub-tile one, against float64."""
    import random

    from lower.profile import grid_choices
    from lower.testing import random_inputs
    from mugraph.core.ir import RESCALED, RUNNING_MAX, accum_monoid
    from mugraph.core.randgraph import ONLINE_LOWERING, random_ugraph

    monoids = set()
    for seed in range(20):
        g = random_ugraph(seed, ONLINE_LOWERING)
        monoids |= {accum_monoid(o) for op in _kernels(g) for o in op.attrs["block"].ops if o.kind == "accum"}
        rng = random.Random(seed)
        cfgs = {op.id: KernelConfig(split=s, sub=sub) for op in _kernels(g)
                for s, sub in [rng.choice(grid_choices(op.attrs["block"], max_programs=64, min_tile=1))]}
        for configs in ({}, cfgs):
            prog = lower.compile(g, device="cpu", configs=configs, poison=True)
            errs = check(prog, g, random_inputs(g, seed))
            assert max(errs) <= 1e-4, (seed, {k: c.label() for k, c in configs.items()}, errs, str(g))
    assert {RESCALED, RUNNING_MAX} <= monoids
