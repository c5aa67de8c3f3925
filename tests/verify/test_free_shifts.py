"""Safe softmax: ``max`` as a free shift (docs/design.md §3.3). The verifier gives every
max a fresh value per element, so a comparison holds for every value the maxima could take
— the true ones among them. A softmax shifted by its row max equals the same softmax
shifted by any per-row value; a split (flash-decoding) form that rescales its partial sums
equals it; every mistake that makes the result depend on the shift's value is rejected."""


import pytest

import mugraph as mg
import verify

N, D = 64, 8


def _attention(name, shift=lambda s: mg.max(s, 1), den_shift=True):
    """Σ_j exp(s_j − m)·v_j / Σ_j exp(s_j − m) over a row of N scores."""
    p = mg.Program(name)
    s, v = p.input("s", (4, N), "float32"), p.input("v", (N, D), "float32")
    m = shift(s)
    e = mg.exp(s - m)
    den = mg.sum(e, 1) if den_shift else mg.sum(mg.exp(s), 1)
    p.output((e @ v) / den)
    return p


def _split(name, chunks=2, forget=None, swap_rescale=False, cross_max=False, combine=mg.max):
    """The flash-decoding form: per chunk its own max m_c, its partial numerator and
    denominator; then M = max_c m_c and both rescaled by exp(m_c − M) and summed."""
    p = mg.Program(name)
    s, v = p.input("s", (4, N), "float32"), p.input("v", (N, D), "float32")
    w = N // chunks
    parts = []
    for c in range(chunks):
        sc, vc = mg.slice(s, 1, c * w, (c + 1) * w), mg.slice(v, 0, c * w, (c + 1) * w)
        mc = mg.max(sc, 1)
        parts.append((mc, sc, vc))
    ms = [mc for mc, _, _ in parts]
    M = combine(mg.concat(ms, 1), 1)
    num = den = None
    for c, (mc, sc, vc) in enumerate(parts):
        use = ms[(c + 1) % chunks] if cross_max else mc  # a max over one chunk applied to another
        e = mg.exp(sc - use)
        acc, d = e @ vc, mg.sum(e, 1)
        r = mg.exp(mc - M)
        if forget == c:  # the combine forgets to rescale this side
            ra, rd = acc, d
        elif swap_rescale and c == 0:  # the rescale on the denominator only
            ra, rd = acc, r * d
        else:
            ra, rd = r * acc, r * d
        num = ra if num is None else num + ra
        den = rd if den is None else den + rd
    p.output(num / den)
    return p


def _verdict(a, b):
    return verify.equivalent(a, b, seed=5, float_check=False)


def test_a_safe_softmax_program_is_lax_with_the_extension():
    mg.check_lax(_attention("safe"))
    mg.check_lax(_split("split"))


@pytest.mark.parametrize("name, other", [
    ("shift by 2·max", lambda: _attention("b", shift=lambda s: mg.scale(mg.max(s, 1), 2))),
    ("shift by the mean", lambda: _attention("b", shift=lambda s: mg.mean(s, 1))),
    ("shift by a constant", lambda: _attention("b", shift=lambda s: mg.scale(mg.sum(s, 1), 0) + 3)),
    ("the split form", lambda: _split("b")),
    ("the split form, 4 chunks", lambda: _split("b", chunks=4)),
    # any per-row value serves as the combine's shift: the sum of the partial maxima too
    ("a combine shifted by the sum of the partial maxima", lambda: _split("b", combine=mg.sum)),
])
def test_equivalent_shifts_and_forms_are_accepted(name, other):
    v = _verdict(_attention("safe"), other())
    assert v.equivalent and v.bound_met, f"{name}: {v}"


@pytest.mark.parametrize("name, other", [
    ("max over the wrong dim", lambda: _attention("b", shift=lambda s: mg.max(s, 0))),
    ("a denominator without the shift", lambda: _attention("b", den_shift=False)),
    ("a combine that forgets to rescale one side", lambda: _split("b", forget=1)),
    ("a rescale applied to the wrong accumulator", lambda: _split("b", swap_rescale=True)),
    ("a max over one chunk applied to another", lambda: _split("b", cross_max=True)),
])
def test_near_misses_are_rejected(name, other):
    v = _verdict(_attention("safe"), other())
    assert v.equivalent is False, f"{name}: {v}"


def test_the_bound_is_proven_by_atoms_over_a_long_row():
    """Scores as an input, 4 rows of 32,000: every exponent is s_j − m (an input element
    and a free shift), so the exponent-atom argument applies."""
    p = mg.Program("vocab")
    s, v = p.input("s", (4, 32000), "float16"), p.input("v", (32000, 8), "float16")
    e = mg.exp(s - mg.max(s, 1))
    p.output((e @ v) / mg.sum(e, 1))
    eps, _ = verify.per_test_bound(p, p)
    assert eps < 1e-3  # 2^-10 per test: four tests reach 2^-40


def test_the_float_check_compares_the_real_maxima():
    """In floating point the max is the max: the safe program is finite where the unshifted
    one overflows (logits ×30 in fp16)."""
    import torch

    safe = _attention("safe")
    x = {"s": torch.randn(4, N, dtype=torch.float64) * 30, "v": torch.randn(N, D, dtype=torch.float64)}
    (y,) = mg.evaluate(safe, {k: t.numpy() for k, t in x.items()})
    ref = torch.softmax(x["s"], 1) @ x["v"]
    assert abs(y - ref.numpy()).max() < 1e-9
