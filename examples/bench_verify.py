"""Benchmark of the verifier: soundness on mutants, and speed.

    python examples/bench_verify.py            # 10,000 mutants (a few minutes on 2 cores)
    python examples/bench_verify.py --quick    # 600 mutants, same tables (about a minute)

1. Mutation fuzz: mutants of random Lax programs, random μGraphs and the
   reference μGraphs (small shapes) are judged by ``verify.equivalent`` (default
   primes, error 2^-40, no float check) and by the float64 interpreter (the ground
   truth). Accepted-but-different must be 0; rejected-but-same (false rejections)
   must be 0 too. For every different mutant, one single field test with Mirage's
   primes p=167, q=83 is also run: the count it accepts is how often Mirage's one
   deterministic test would have been fooled.
2. Speed: one field test of the full-size gqa (b=1) and gated_mlp μGraphs against
   their programs — by phase (draw inputs + ω, program, μGraph, compare) and whole
   (``verify.field_test``) — and field tests per second at the small shapes the
   search uses (fingerprints, and full pairs). A test's first run in a process
   is slower (fresh memory is faulted in, torch starts its threads): the full-size
   timings are taken after it, as best and median of a few runs.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify  # noqa: E402
from mugraph.benchmarks import REFERENCES, program, reference  # noqa: E402
from verify.family import DEFAULT  # noqa: E402
from verify.field import MIRAGE  # noqa: E402
from verify.fuzz import differs, mutate, random_program, random_ugraph  # noqa: E402


def fuzz(n: int, seed: int):
    rng = np.random.default_rng(seed)
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    c = collections.Counter()
    per = collections.defaultdict(collections.Counter)
    t0 = time.perf_counter()
    i = 0
    while c["mutants"] < n:
        kind = i % 3
        g = refs[(i // 3) % len(refs)] if kind == 0 else random_program(rng) if kind == 1 else random_ugraph(rng)
        i += 1
        r = mutate(g, rng)
        if r is None:
            continue
        m, name = r
        c["mutants"] += 1
        truth = differs(g, m, seed=i)
        if truth is None:
            c["undecided (float64 not finite)"] += 1
            continue
        v = verify.equivalent(g, m, seed=i, float_check=False)
        acc = bool(v.equivalent)
        key = ("accepted" if acc else "rejected") + "-but-" + ("different" if truth else "same") \
            if acc == truth else ("accepted-same" if acc else "rejected-different")
        c[key] += 1
        per[name]["different" if truth else "same"] += 1
        if truth:
            try:
                fooled = verify.field_test(g, m, rng=rng, fld=MIRAGE, max_failed_draws=8)[0] is None
            except verify.ZeroDivisorDraw:  # with p=167 a large divisor is often 0 somewhere
                c["mirage no usable draw"] += 1
                continue
            c["mirage single test fooled"] += fooled
            per[name]["mirage fooled"] += fooled
        if c["mutants"] % 1000 == 0:
            print(f"  … {c['mutants']} mutants, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return c, per, time.perf_counter() - t0


def time_field_test(name: str, reps: int):
    """Seconds for the phases of one field test of the full-size μGraph against its
    program (best of ``reps``), and for the whole test as ``verify.field_test`` runs
    it (best and median): draw inputs + ω, program, μGraph, exact compare."""
    import mugraph as mg
    from verify.equivalence import _first_mismatch, live_graph

    g, p = live_graph(reference(name)), live_graph(program(name))
    need = verify.equivalence.inputs_needing_q(g) | verify.equivalence.inputs_needing_q(p)
    specs = [(t.name, t.shape, t.name in need) for t in sorted(g.inputs, key=lambda t: t.name)]
    rng = np.random.default_rng(0)
    draw, prog, ev, cmp, full = [], [], [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        alg = verify.FieldAlgebra(DEFAULT, verify.field.random_omega(DEFAULT, rng))
        ins = verify.field.draw_inputs(specs, DEFAULT, rng)
        t1 = time.perf_counter()
        oa = mg.evaluate(p, ins, alg)
        t2 = time.perf_counter()
        ob = mg.evaluate(g, ins, alg)
        t3 = time.perf_counter()
        assert _first_mismatch(oa, ob) is None
        t4 = time.perf_counter()
        del alg, ins, oa, ob
        t5 = time.perf_counter()
        assert verify.field_test(p, g, rng=rng, need_q=need)[0] is None
        full.append(time.perf_counter() - t5)
        for acc, t in ((draw, t1 - t0), (prog, t2 - t1), (ev, t3 - t2), (cmp, t4 - t3)):
            acc.append(t)
    return min(draw), min(prog), min(ev), min(cmp), min(full), float(np.median(full))


def small_rates(seconds: float):
    out = []
    for name in sorted(REFERENCES):
        g, p = reference(name, small=True), program(name, small=True)
        verify.fingerprint(g)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            verify.fingerprint(g)
            n += 1
        fp = n / (time.perf_counter() - t0)
        rng = np.random.default_rng(0)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            verify.field_test(p, g, rng=rng)
            n += 1
        ft = n / (time.perf_counter() - t0)
        out.append((name, fp, ft))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="600 mutants and shorter timings")
    ap.add_argument("--mutants", type=int, default=None)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    n = args.mutants or (600 if args.quick else 10_000)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small shapes: thread start-up would dominate (the search runs 1 thread/worker)
    c, per, secs = fuzz(n, args.seed)
    diff = c["rejected-different"] + c["accepted-but-different"]
    same = c["accepted-same"] + c["rejected-but-same"]
    print(f"## Mutation fuzz ({c['mutants']} mutants, seed {args.seed}, {secs:.0f} s; primes {DEFAULT}, error 2^-40)")
    print()
    print("| outcome | count |")
    print("|---|---|")
    print(f"| different (float64), rejected | {c['rejected-different']} |")
    print(f"| **different, accepted (false accepts)** | **{c['accepted-but-different']}** |")
    print(f"| same function, accepted | {c['accepted-same']} |")
    print(f"| **same function, rejected (false rejections)** | **{c['rejected-but-same']}** |")
    print(f"| undecided (float64 overflow) | {c['undecided (float64 not finite)']} |")
    tried = diff - c["mirage no usable draw"]
    rate = c["mirage single test fooled"] / tried if tried else 0.0
    print(f"| one test with Mirage's p=167, q=83 fooled by a different mutant | "
          f"{c['mirage single test fooled']} of {tried} ({100 * rate:.2f}%) |")
    print(f"| … no draw without a zero divisor in 8 tries with p=167 | {c['mirage no usable draw']} |")
    print()
    print("| mutation | different | same | Mirage single test fooled |")
    print("|---|---|---|---|")
    for name in sorted(per):
        d = per[name]
        print(f"| {name} | {d['different']} | {d['same']} | {d['mirage fooled']} |")
    print()

    reps = 3 if args.quick else 5
    torch.set_num_threads(threads)
    print(f"## One field test at full size (b=1; {DEFAULT}; {threads} torch threads; phases: best of {reps}; "
          f"full test: best and median of {reps})")
    print()
    print("| μGraph | draw inputs + ω | evaluate program | evaluate μGraph | compare | "
          "**full test** (draw + program + μGraph + compare) | median |")
    print("|---|---|---|---|---|---|---|")
    for name in ("gqa", "gated_mlp"):
        d, pr, e, cm, b, med = time_field_test(name, reps)
        print(f"| {name} | {d:.3f} s | {pr:.3f} s | {e:.3f} s | {cm:.3f} s | **{b:.3f} s** | {med:.3f} s |")
    print()
    torch.set_num_threads(1)
    print("## Field tests per second at the small shapes (mugraph.benchmarks.SMALL; one thread)")
    print()
    print("| benchmark | fingerprints/s (μGraph) | full tests/s (program + μGraph) |")
    print("|---|---|---|")
    for name, fp, ft in small_rates(0.5 if args.quick else 2.0):
        print(f"| {name} | {fp:.0f} | {ft:.0f} |")
    bad = c["accepted-but-different"] + c["rejected-but-same"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
