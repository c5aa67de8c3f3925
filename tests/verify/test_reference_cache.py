"""A Reference evaluates the program once per draw even when the drawn residues overflow
its cache: the program's outputs have a budget of their own; on a GPU the cache is a share
of the free memory."""

import verify
from mugraph.core.benchmarks import program, reference


def test_program_evaluated_once_per_draw_when_residues_do_not_fit():
    p, g = program("gqa", small=True), reference("gqa", small=True)
    # small gqa: one draw's residues are ~200 KiB (Q's 8 KiB a part, K's and V's 64 KiB),
    # its output's p-part 8 KiB: 72 KiB holds the outputs of every test, not one draw
    ref = verify.Reference(p, seed=3, device="cpu", cache_bytes=72 << 10)
    v1 = ref.equivalent(g, float_check=False)
    assert v1.ok and v1.tests >= 2 and ref.evaluations == v1.tests
    v2 = ref.equivalent(g, float_check=False)
    assert v2.ok and v2.tests == v1.tests
    assert ref.evaluations == v1.tests  # the second candidate re-used every output
    assert v2.equivalent == verify.equivalent(p, g, seed=3, float_check=False, device="cpu").equivalent


def test_default_cache_sizes_follow_the_memory(monkeypatch):
    """On a GPU the draws are most of a verification: a quarter of the free memory is kept,
    at most GPU_CACHE_BYTES and never less than DRAW_CACHE_BYTES; on the CPU a sixteenth of
    the machine's memory, between DRAW_CACHE_BYTES and CPU_CACHE_MAX."""
    import torch

    from verify import equivalence as eq

    gib = 1 << 30
    cuda = torch.device("cuda")
    for free, want in [(8 * gib, 2 * gib), (200 * gib, eq.GPU_CACHE_BYTES), (gib, eq.DRAW_CACHE_BYTES)]:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, f=free: (f, 80 * gib))
        assert eq.default_cache_bytes(cuda) == want
    cpu = torch.device("cpu")
    for mem, want in [(4 * gib, eq.DRAW_CACHE_BYTES), (24 * gib, 24 * gib // 16), (512 * gib, eq.CPU_CACHE_MAX),
                      (0, eq.DRAW_CACHE_BYTES)]:
        monkeypatch.setattr(eq, "_physical_memory", lambda m=mem: m)
        assert eq.default_cache_bytes(cpu) == want


def test_prepare_computes_the_program_side_a_verdict_reads():
    """``Reference.prepare`` evaluates the program on every draw a candidate's trial needs and
    prepares the float check's reference side; a later verdict then evaluates the program
    no more, and is the verdict of an unprepared reference — a near miss still fails."""
    from mugraph.core.benchmarks import program as bench_program

    p, g = bench_program("gqa", small=True), reference("gqa", small=True)
    ref = verify.Reference(p, seed=5, device="cpu")
    tests = ref.prepare()
    assert tests >= 2 and ref.evaluations >= tests
    before = ref.evaluations
    v = ref.equivalent(g)
    assert v.ok and v.tests == tests and ref.evaluations == before
    fresh = verify.Reference(p, seed=5, device="cpu").equivalent(g)
    assert (v.equivalent, v.tests, v.error_bound, v.float_check.passed) == \
        (fresh.equivalent, fresh.tests, fresh.error_bound, fresh.float_check.passed)
    assert ref.equivalent(_unnormalized(p)).equivalent is False  # a near miss: no normalization


def _unnormalized(p):
    """``p``'s attention without dividing by the sum of the exponentials."""
    import mugraph as mg

    g = mg.Program("unnormalized")
    q, k, v = (g.input(t.name, t.shape, t.dtype) for t in p.inputs)
    g.output(mg.exp(q @ k) @ v)
    return g


def test_prepare_stops_when_asked():
    """``stop()`` is asked before each draw: asked to stop at once, nothing is evaluated."""
    from mugraph.core.benchmarks import program as bench_program

    ref = verify.Reference(bench_program("gqa", small=True), seed=5, device="cpu")
    assert ref.prepare(stop=lambda: True) == 0 and ref.evaluations == 0
