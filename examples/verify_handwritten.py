"""Verify a hand-written FlashDecoding-style gqa μGraph against its program, and
catch two subtly broken variants with a counterexample.

    python examples/verify_handwritten.py            # small shapes (seconds)
    python examples/verify_handwritten.py --full     # Mirage's shapes (b=1)

The same check from the command line, with the graphs in files:

    python -m mugraph verify gqa.json gqa_kernel.json
    python -m mugraph verify pair.py pair.py         # a .py defining REF and CAND

The μGraph (as in ``mugraph.core.benchmarks.handwritten``) runs two kernels. Kernel 1,
grid (batch, KV chunk), loops through its chunk accumulating Σ exp(q·k) and
Σ exp(q·k)·v; kernel 2, grid (batch, query rows), loops over the chunks,
accumulates both partials and divides. The bugs:

* ``omap``: kernel 2 writes its blocks to the wrong place (batch and row axes
  exchanged in the output) — every block computes the right numbers;
* ``no_division``: kernel 2 forgets to divide by the exp-sums (an unnormalized
  softmax);
* ``off_by_one``: kernel 1 rescales its two partial sums by 1/C and 1/(C−1) —
  a block count off by one; harmless if both used the same factor, wrong as is
  (the kind of per-block rescaling slip flash-attention variants invite).
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mugraph as mg  # noqa: E402
import verify  # noqa: E402
from mugraph.core.benchmarks import program  # noqa: E402

SMALL = dict(queries=32, head_dim=16, kv=256, chunks=4, loop=4, row_tile=16)
FULL = dict(queries=256, head_dim=64, kv=4096, chunks=16, loop=4, row_tile=64)


def gqa_kernel(b: int = 1, queries: int = 256, head_dim: int = 64, kv: int = 4096, chunks: int = 16,
               loop: int = 4, row_tile: int = 64, bug: str | None = None) -> mg.KernelGraph:
    """The split-KV gqa μGraph, optionally with one planted ``bug``."""
    kg = mg.KernelGraph("gqa_kernel" + (f"[{bug}]" if bug else ""))
    B = 2 * b
    Q = kg.input("Q", (B, queries, head_dim))
    K = kg.input("K", (B, head_dim, kv))
    V = kg.input("V", (B, kv, head_dim))
    C, F = chunks, loop
    k1 = mg.BlockGraph(grid=(B, C, 1), forloop=F)
    q = k1.input(Q, imap=(0, None))
    k = k1.input(K, imap=(0, 2), fmap=2)
    v = k1.input(V, imap=(0, 1), fmap=1)
    e = mg.exp(q @ k)
    z = k1.accum(mg.sum(e, 2))
    ev = k1.accum(e @ v)
    if bug == "off_by_one":  # equal factors would cancel in the ratio; these differ by one block
        z = mg.scale(z, Fraction(1, C))
        ev = mg.scale(ev, Fraction(1, C - 1))
    k1.output(z, omap=(0, 2))
    k1.output(ev, omap=(0, 2))
    Z, EV = kg.kernel(k1)
    R = queries // row_tile
    k2 = mg.BlockGraph(grid=(B, R, 1), forloop=C)
    zs = k2.accum(k2.input(Z, imap=(0, 1), fmap=2))
    evs = k2.accum(k2.input(EV, imap=(0, 1), fmap=2))
    y = evs if bug == "no_division" else evs / zs
    k2.output(y, omap=(1, 0) if bug == "omap" else (0, 1))
    (Y,) = kg.kernel(k2)
    kg.output(Y)
    return kg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="Mirage's full shapes (slower)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sizes = FULL if args.full else SMALL
    p = program("gqa", queries=sizes["queries"], head_dim=sizes["head_dim"], kv=sizes["kv"])
    status = 0
    for bug in (None, "omap", "no_division", "off_by_one"):
        if bug == "omap" and sizes["queries"] // sizes["row_tile"] != 2:
            # the omap swap needs as many row blocks as batch entries to keep the shape
            sizes_bug = {**sizes, "row_tile": sizes["queries"] // 2}
        else:
            sizes_bug = sizes
        g = gqa_kernel(bug=bug, **sizes_bug)
        v = verify.equivalent(p, g, seed=args.seed, float_check=bug is None)
        print(v)
        print()
        expected = bug is None
        if bool(v.equivalent) != expected or (bug and v.counterexample is None):
            print(f"UNEXPECTED verdict for bug={bug}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
