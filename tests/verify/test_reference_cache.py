"""A Reference evaluates the program once per draw even when the drawn residues overflow
its cache: the program's outputs have a budget of their own."""

import verify
from mugraph.benchmarks import program, reference


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
