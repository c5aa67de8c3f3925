"""The sampled fingerprint: :class:`verify.Fingerprinter` answers exactly what comparing
full fingerprints answers, and the sampled evaluation it rests on
(:func:`mugraph.core.interpreter.evaluate` with ``blocks``) computes the full evaluation's
values at the positions :func:`~mugraph.core.interpreter.saved_positions` names."""

import numpy as np
import pytest
import torch

import mugraph as mg
import verify
from mugraph.core.benchmarks import REFERENCES, program, reference
from mugraph.core.errors import MugraphError
from mugraph.core.interpreter import evaluate, saved_positions
from verify.equivalence import sample_blocks
from verify.fuzz import mutate


def _inputs(g, seed=0):
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) for t in g.inputs}


def _mutants(g, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = mutate(g, rng)
        if m is not None:
            out.append(m[0])
    return out


@pytest.mark.parametrize("name", REFERENCES)
def test_sampled_evaluation_is_the_full_one_at_the_written_positions(name):
    for g in [reference(name, small=True)] + _mutants(reference(name, small=True), 6):
        picks = sample_blocks(g, seed=3)
        if not picks:
            continue
        ins = _inputs(g)
        full = evaluate(g, ins)
        part = evaluate(g, ins, blocks=picks)
        for t, f, s in zip(g.outputs, full, part):
            op = next((op for op in g.ops if op.id in picks and t in op.outputs), None)
            if op is None:
                np.testing.assert_array_equal(s, f)
                continue
            block = op.attrs["block"]
            pos = saved_positions(block, block.savers[op.outputs.index(t)], picks[op.id])
            assert s.shape == tuple(len(ix) for ix in pos) and s.size < f.size
            np.testing.assert_array_equal(s, f[np.ix_(*pos)])


@pytest.mark.parametrize("name", REFERENCES)
def test_fingerprinter_answers_what_full_fingerprints_answer(name):
    p, g = program(name, small=True), reference(name, small=True)
    fp = verify.Fingerprinter(p)
    target = verify.fingerprint(p)
    decided = 0
    for h in [g] + _mutants(g, 24, seed=1):
        try:
            want = verify.fingerprint(h) == target
        except MugraphError:
            continue
        assert fp.matches(h) == want, h.name
        decided += 1
    assert fp.matches(g) and decided > 10
    if sample_blocks(g):  # the sample decided some mutants without a full evaluation
        assert fp.sample_rejected > 0


def test_sample_skips_block_zero_and_kernels_whose_outputs_are_read():
    kg = mg.KernelGraph("two")
    X = kg.input("x", (64, 32), "float32")
    bg = mg.BlockGraph(grid=(8, 1, 1), forloop=1)
    bg.output(bg.accum(mg.exp(bg.input(X, imap=(0,)))), omap=(0,))
    (Y,) = kg.kernel(bg)
    bg2 = mg.BlockGraph(grid=(16, 2, 1), forloop=1)
    bg2.output(bg2.accum(bg2.input(Y, imap=(0, 1)) * 2), omap=(0, 1))
    (Z,) = kg.kernel(bg2)
    kg.output(Z)
    picks = sample_blocks(kg, seed=0)
    first, second = [op for op in kg.ops if op.kind == "graph_defined"]
    assert first.id not in picks  # its output is read by the second kernel
    gx, gy, gz = picks[second.id]
    assert len(gx) == 2 and 0 not in gx and gy == (0, 1) and gz == (0,)


def _tiled_exp(omap):
    kg = mg.KernelGraph("tiled")
    X = kg.input("x", (64, 64), "float32")
    bg = mg.BlockGraph(grid=(8, 8, 1), forloop=1)
    bg.output(bg.accum(mg.exp(bg.input(X, imap=(0, 1)))), omap=omap)
    (Y,) = kg.kernel(bg)
    kg.output(Y)
    return kg


def test_a_swapped_axis_is_rejected_by_the_sample():
    """A candidate writing block (i, j)'s tile at (j, i) is right on the diagonal only
    (block 0 among them); the sample rejects it without a full evaluation."""
    p = mg.Program("tiled")
    p.output(mg.exp(p.input("x", (64, 64), "float32")))
    fp = verify.Fingerprinter(p)
    assert fp.matches(_tiled_exp((0, 1))) and fp.full == 1
    assert not fp.matches(_tiled_exp((1, 0)))
    assert fp.sample_rejected == 1 and fp.full == 1


def test_fingerprinter_refuses_bad_arguments():
    p = program("lora", small=True)
    with pytest.raises(MugraphError, match="seed"):
        verify.Fingerprinter(p, seed=-1)
    with pytest.raises(MugraphError, match="per_axis"):
        verify.Fingerprinter(p, per_axis=0)
    assert torch.is_tensor(verify.Fingerprinter(p).target()[0])


def test_a_fingerprint_past_its_deadline_stops_mid_evaluation_and_answers_nothing():
    """``stop_at`` cuts a candidate's evaluation between its parts (a search's worker at a
    large weight would otherwise run seconds past its deadline), raising
    ``EvaluationStopped`` — which is no ``MugraphError``: the search reads those as "this
    draw decides nothing, let verification decide", a match it must not record. A deadline
    not yet passed changes nothing."""
    import time

    p, g = program("lora", small=True), reference("lora", small=True)
    fp = verify.Fingerprinter(p)
    fp.target()  # the program's side, made before the clock matters
    with pytest.raises(verify.EvaluationStopped):
        fp.matches(g, stop_at=time.monotonic() - 1.0)
    assert not issubclass(verify.EvaluationStopped, MugraphError)
    assert fp.matches(g, stop_at=time.monotonic() + 600.0)
    wrong = _mutants(g, 6, seed=2)
    assert any(not fp.matches(h, stop_at=time.monotonic() + 600.0) for h in wrong)
