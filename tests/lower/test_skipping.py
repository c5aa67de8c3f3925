"""Skipping the loop steps a band mask hides from a whole program (``lower.skipping``):
the step range each program runs against the band's values, the abstract evaluation that
decides a masked step adds nothing (accepted: the online softmax, the unsafe exp, a
constant factor ≥ 1; refused: the mask subtracted, scaled below 1, summed itself,
multiplied into a value, a band hiding a whole row), and the lowered kernels, skipping
and not, against float64 at logits ×30. CPU only (Triton interpreter)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import lower
import mugraph as mg
from lower.config import KernelConfig
from lower.plan import plan
from lower.skipping import ANY, DATA, ZERO, step_kinds
from lower.testing import rel_error
from mugraph.core.fills import BandMask, eval_bounds

from online_graphs import attention_ugraph

TOL = {"float32": 1e-5, "float16": 2e-3}


def _kernel(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


def _plan(g, label: str = "w4s2"):
    return plan(_kernel(g).attrs["block"], KernelConfig.from_label(label))


# -- the steps each program runs ---------------------------------------------------------

def _visible_steps(band: BandMask, row0: int, rows: int, n_rows: int, n_keys: int, width: int) -> set[int]:
    """Steps with a visible position among this program's real rows, from the band's values."""
    vis = band.values((n_rows, n_keys), "float32") == 0
    block = vis[row0:row0 + rows]
    return {i for i in range(math.ceil(n_keys / width)) if block[:, i * width:(i + 1) * width].any()}


def test_step_bounds_hold_every_visible_step_and_are_tight_without_a_period():
    rnd = random.Random(7)
    for _ in range(400):
        width = rnd.choice([4, 8, 16])
        n_keys = width * rnd.randint(1, 8)
        rows = rnd.randint(1, 12)
        n_rows = rows * rnd.randint(1, 6)
        period = rnd.choice([None, None, rnd.randint(1, n_rows)])
        window = rnd.choice([None, rnd.randint(1, n_keys)])
        band = BandMask(rnd.randint(0, n_keys), window, period)
        first, end = band.step_bounds("r0", rows, "0", width, width)
        for row0 in range(0, n_rows, rows):
            want = _visible_steps(band, row0, rows, n_rows, n_keys, width)
            # the kernel clips the end to its loop's
            lo, hi = eval_bounds(first, {"r0": row0}), min(eval_bounds(end, {"r0": row0}), n_keys // width)
            assert want <= set(range(lo, hi)), (band, row0, rows, width, want, lo, hi)
            if period is None and want:
                assert (lo, hi) == (min(want), max(want) + 1), (band, row0, rows, width, want, lo, hi)


def test_every_row_sees_matches_the_values():
    for band in [BandMask(0), BandMask(-1), BandMask(3, window=2), BandMask(0, window=1, period=5),
                 BandMask(-2, period=3), BandMask(20, window=4)]:
        for rows, keys in [(8, 8), (8, 16), (16, 8), (1, 30)]:
            vis = band.values((rows, keys), "float32") == 0
            assert band.every_row_sees(rows, keys) == bool(vis.any(axis=1).all()), (band, rows, keys)


def test_the_mean_steps_of_a_causal_prompt_are_about_half():
    g = attention_ugraph(8, 16, 128, 16, 8, "float16", mg.causal_mask())
    p = _plan(g)
    assert p.masked is not None
    # program b holds rows 16b … 16b+15 and runs steps 0 … b: (1 + … + 8) / 8
    assert p.mean_steps == pytest.approx(4.5)
    p2 = _plan(g, "w4s2k2")
    assert p2.mean_steps == pytest.approx(4.5 / 2)   # per (program, split): the same steps split in two
    assert _plan(g, "w4s2F").masked is None and _plan(g, "w4s2F").mean_steps == 8


# -- when a masked step adds nothing -------------------------------------------------------

def _masked_graph(body, fill=None, rows: int = 16, keys: int = 64, steps: int = 4, post=None):
    """One block per 16 rows, the loop over the keys of ``s`` and a filled ``bias`` read
    alike; ``body(st, bt, vt, bg)`` returns the output tile after the loop."""
    g = mg.KernelGraph("masked")
    s = g.input("s", (2 * rows, keys), "float32")
    v = g.input("v", (keys, 8), "float32")
    bias = g.input("bias", (2 * rows, keys), "float32", fill=fill or mg.causal_mask())
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=steps)
    st, bt = bg.input(s, (0, None, None), 1), bg.input(bias, (0, None, None), 1)
    vt = bg.input(v, (None, None, None), 0)
    bg.output(body(st, bt, vt, bg), (0, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


def _online(st, bt, vt, bg):
    x = st + bt
    m = mg.max(x, 1)
    e = mg.exp(x - m)
    return bg.accum(e @ vt, m) / bg.accum(mg.sum(e, 1), m)


ACCEPTED = {
    "online softmax": _online,
    "unsafe exp": lambda st, bt, vt, bg: bg.accum(mg.exp(st + bt) @ vt) / bg.accum(mg.sum(mg.exp(st + bt), 1)),
    "scaled after the mask by 2": lambda st, bt, vt, bg: bg.accum(mg.exp(mg.scale(st + bt, 2)) @ vt),
    "running max read after the loop": lambda st, bt, vt, bg: bg.accum_max(mg.max(st + bt, 1)),
    "bias minus a data shift": lambda st, bt, vt, bg: bg.accum(mg.sum(mg.exp(bt - mg.max(st, 1)), 1)),
}

REFUSED = {
    "the mask subtracted": lambda st, bt, vt, bg: bg.accum(mg.exp(st - bt) @ vt),
    "scaled below 1 before exp": lambda st, bt, vt, bg: bg.accum(mg.exp(mg.scale(st + bt, 1 / 1024)) @ vt),
    "the mask summed itself": lambda st, bt, vt, bg: bg.accum(mg.sum(bt, 1)),
    "the mask as a factor": lambda st, bt, vt, bg: bg.accum((st * bt) @ vt),
    "a data term beside the masked one": lambda st, bt, vt, bg: bg.accum(mg.exp(st + bt) @ vt + st @ vt),
    "a plain sum of the shifted terms": lambda st, bt, vt, bg: bg.accum(
        mg.sum(mg.exp((st + bt) - mg.max(st + bt, 1)), 1)),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_masked_step_that_adds_nothing_is_skipped(name):
    assert _plan(_masked_graph(ACCEPTED[name])).masked is not None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_masked_step_that_may_add_something_is_run(name):
    assert _plan(_masked_graph(REFUSED[name])).masked is None


@pytest.mark.parametrize("fill", [mg.causal_mask(-1), mg.causal_mask(-40), mg.causal_mask(70, window=3)], ids=str)
def test_a_band_hiding_a_whole_row_is_never_skipped(fill):
    """A fully masked row's softmax is over masked values alone: every step counts."""
    assert _plan(_masked_graph(_online, fill)).masked is None


def test_the_kinds_of_an_online_step():
    g = _masked_graph(_online)
    p = _plan(g)
    kinds = step_kinds(p, p.masked.op)
    by_kind = {op.kind: kinds[op.outputs[0].id] for op in p.schedule.loop if op.outputs[0].id in kinds}
    assert by_kind["add"] == 1 and by_kind["max"] == 1      # NEG(1): the masked value plus data
    assert by_kind["sub"] == DATA and by_kind["exp"] == DATA  # the shift cancels it
    assert ZERO not in by_kind.values() and ANY not in by_kind.values()


# -- the lowered kernels -------------------------------------------------------------------

def _inputs(g, dtype: str, seed: int = 0, logit_scale: float = 30.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    out = {}
    for t in g.inputs:
        if t.fill is None:
            x = torch.randn(t.shape, generator=gen, dtype=torch.float64)
            out[t.name] = (x * (logit_scale if t.name == "q" else 1.0)).to(dt)
    return out


def _reference(x: dict[str, torch.Tensor], fill: BandMask, d: int) -> torch.Tensor:
    s = x["q"].double() @ x["kt"].double() / math.sqrt(d)
    vis = torch.from_numpy(fill.values(tuple(s.shape), "float32") == 0)
    return torch.softmax(s.masked_fill(~vis, float("-inf")), -1) @ x["v"].double()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fill", [mg.causal_mask(), mg.causal_mask(40), mg.causal_mask(0, window=20),
                                  mg.causal_mask(5, period=16)], ids=str)
@pytest.mark.parametrize("label", ["w4s2", "w4s3k2L", "w4s2k4"])
def test_skipping_kernels_match_float64_and_the_full_loop(dtype, fill, label):
    g = attention_ugraph(4, 16, 128, 16, 8, dtype, fill)
    cfg = KernelConfig.from_label(label)
    full = KernelConfig.from_label(label + "F")
    kid = _kernel(g).id
    prog = lower.compile(g, device="cpu", configs={kid: cfg}, poison=True)
    ref_prog = lower.compile(g, device="cpu", configs={kid: full}, poison=True)
    assert "i_end = " in prog.triton_source() and "i_end = " not in ref_prog.triton_source()
    x = _inputs(g, dtype)
    want = _reference(x, fill, 16)
    got, got_full = prog(**x), ref_prog(**x)
    assert rel_error(got, want) <= TOL[dtype]
    assert rel_error(got, got_full) <= TOL[dtype]


def test_a_program_whose_split_sees_nothing_combines_to_the_full_answer():
    """Split 4 of a causal prompt: the first rows' later splits run no step at all and hand
    over a -inf maximum with zero sums; the combine rescales them away."""
    g = attention_ugraph(4, 16, 128, 16, 8, "float16", mg.causal_mask())
    prog = lower.compile(g, device="cpu", configs={_kernel(g).id: KernelConfig.from_label("w4s2k4")}, poison=True)
    x = _inputs(g, "float16", seed=3)
    assert not np.isnan(prog(**x).float().numpy()).any()
    assert rel_error(prog(**x), _reference(x, mg.causal_mask(), 16)) <= TOL["float16"]
