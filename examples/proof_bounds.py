"""The verifier's per-test bound by program class: the classic exponent analysis (term
counts, collisions, the Li–Wu conjecture, conditioned on no zero divisor) against the
bound used now — the exponent-atom argument (``verify.bound.AtomMode``) where it applies,
and void draws counted instead of conditioned on where that needs fewer tests
(``verify.equivalence.trial_rule``) — and the time ``verify.equivalent`` takes to prove each
program against its hand-written μGraph (or a second copy of itself where it has none).

    python examples/proof_bounds.py                 # the table (a few minutes on 2 cores)
    python examples/proof_bounds.py --no-verify     # bounds only (seconds)

Prints a Markdown table: program, shapes, classic per-test bound, the bound used now, its
argument and whether void draws are counted, tests to reach 2^-40, and seconds to prove.
``--no-verify`` adds safe-softmax prompt attention at 2k–8k keys (bounds only: its tests
need a GPU machine's memory).
"""

from __future__ import annotations

import argparse
import time

import mugraph as mg
import verify
from mugraph.core.benchmarks import DECODE, REFERENCES, decode_attention, prefill_attention, program, reference
from verify.bound import pair_bound
from verify.equivalence import DEFAULT_ERROR, _bound, make_plan, summarize, trial_rule
from verify.family import DEFAULT
from mugraph.core.rewrite import live_graph


def vocab_softmax(m: int = 32, n: int = 32000) -> mg.Program:
    """A softmax-weighted sum over a vocabulary: Σ exp(X)·Y / Σ exp(X)."""
    p = mg.Program("vocab_softmax")
    X, Y = p.input("X", (m, n), "float16"), p.input("Y", (m, n), "float16")
    E = mg.exp(X)
    p.output(mg.sum(E * Y, 1) / mg.sum(E, 1))
    return p


def silu_mlp(m: int = 16, hidden: int = 512, inter: int = 4096) -> mg.Program:
    """A SiLU MLP whose second matmul sums silu over a long row."""
    p = mg.Program("silu_mlp")
    X = p.input("X", (m, hidden), "float16")
    W1, W2 = p.input("W1", (hidden, inter), "float16"), p.input("W2", (inter, hidden), "float16")
    p.output(mg.silu(X @ W1) @ W2)
    return p


def router(m: int = 16, hidden: int = 4096, experts: int = 64) -> mg.Program:
    """A softmax router: the experts' weights of each token (without its max)."""
    p = mg.Program("softmax_router")
    X, W = p.input("X", (m, hidden), "float16"), p.input("W", (hidden, experts), "float16")
    E = mg.exp(X @ W)
    p.output(E / mg.sum(E, 1))
    return p


def classic(a, b) -> float:
    plan = make_plan(a, b, DEFAULT)
    oa, sa = summarize(live_graph(a), plan.primes, "a")
    ob, sb = summarize(live_graph(b), plan.primes, "b")
    return pair_bound(plan.primes, oa, ob, sa.z + sb.z)


def rows(large: bool = False):
    yield "vocab_softmax", vocab_softmax(), None
    yield "silu_mlp", silu_mlp(), None
    yield "softmax_router", router(), None
    for name in sorted(REFERENCES):
        for b in (1, 8):
            yield f"{name} b={b}", program(name, b=b), reference(name, b=b)
    for name, sizes in DECODE.items():
        yield name, decode_attention(**sizes), None
    if large:
        for n in (2048, 4096, 8192):
            yield f"safe prefill h16 q{n} n{n} d128", prefill_attention(16, n, n, 128, safe=True), None


def _shapes(p) -> str:
    return ", ".join("×".join(map(str, t.shape)) for t in p.inputs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-verify", action="store_true", help="bounds only: do not run the field tests")
    args = ap.parse_args()
    print("| program | inputs | classic per-test bound | per-test bound now | argument | voids counted | "
          "tests for 2^-40 | prove s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p, ref in rows(large=args.no_verify):
        other = ref if ref is not None else p
        before = classic(p, other)
        bd = _bound(p, other, make_plan(p, other, DEFAULT))
        rule = trial_rule(bd, DEFAULT_ERROR)
        now, argument, need = rule.per_test, bd.argument, rule.needed(0)
        secs = "-"
        if not args.no_verify:
            t0 = time.perf_counter()
            v = verify.equivalent(p, other, seed=0, float_check=False)
            secs = f"{time.perf_counter() - t0:.1f}" + ("" if v.bound_met else " (not met)")
        print(f"| {name} | {_shapes(p)} | {before:.3g} | {now:.3g} | {argument} | "
              f"{'yes' if rule.counts_voids else 'no'} | {need or '-'} | {secs} |",
              flush=True)


if __name__ == "__main__":
    main()
