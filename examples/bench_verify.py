"""Benchmark of the verifier: soundness on mutants, and speed.

    python examples/bench_verify.py                  # 10,000 mutants (about ten minutes on 2 cores) + speed
    python examples/bench_verify.py --quick          # 600 mutants, shorter timings (a few minutes)
    python examples/bench_verify.py --speed --device cuda   # the timings alone, field arithmetic on the GPU
    python examples/bench_verify.py --fuzz --mutants 2000   # the soundness tables alone

1. Mutation fuzz: mutants of the reference μGraphs, random Lax programs (plain, with
   sqrt, and with a 2^40-times larger part next to the rest of an output), random
   μGraphs (small shapes) and random safe-softmax programs (a row max as a free shift,
   plain and split into flash-decoding chunks), by every operator of
   ``verify.fuzz.MUTATIONS`` — those a buggy search would make, those a hostile user
   builds around fixed primes, and a safe softmax's mistakes (a max over the wrong dim,
   an unshifted denominator, a missing or one-sided rescale, a chunk shifted by another
   chunk's max) next to its one equivalent change (``shift_value``: another per-row shift) —
   are judged by ``verify.equivalent`` (random primes per test, error 2^-40, no
   float check) and by the float64 interpreter, element by element (the ground
   truth). Accepted-but-different must be 0; rejected-but-same (false rejections)
   must be 0 too; undecided verdicts (a field mismatch through sqrt or a max that float64
   does not confirm) are counted; every mutation has a row in the per-mutation table, one
   that found no site too. For every different mutant one single field test with
   fixed primes also runs — the largest safe-prime pair below 2^31 (the verifier's
   fixed pair before primes were drawn per test) and Mirage's p=167, q=83 — and the
   count each accepts is how often that fixed test would have been fooled. The fuzz
   runs on the CPU whatever ``--device`` says (it is about soundness, at small shapes).
2. Speed, on ``--device`` (``auto``: CUDA when torch sees a GPU): one field test (draw,
   program, μGraph, compare) at full shapes, b = 1 and 8, for gqa, qknorm_gqa,
   gated_mlp and rmsnorm_matmul; a full verification (``verify.equivalent`` at 2^-40 with
   the float check) of the b = 8 μGraphs of gqa, gated_mlp and rmsnorm_matmul, cold (a fresh process's first call is
   not counted: torch's start-up is not the verifier's), and of one more candidate against
   the same :class:`verify.Reference` (the program's side of every test reused, as the
   search verifies its candidates); and tests per second at the small shapes the search
   uses. Wall time, CPU time of this process (all its threads) and the load average
   are printed for each: the machine may be shared.

Exit status 2 on bad arguments (one line: e.g. ``--device cuda`` where torch sees no
GPU); 1 when anything is judged wrongly: a false accept or false rejection in the fuzz,
or, in the timings (every pair timed is equivalent), a field test that finds
a mismatch, a fingerprint that differs or a full verification that is not ok.
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify  # noqa: E402
from mugraph.core.benchmarks import REFERENCES, program, reference  # noqa: E402
from verify.family import DEFAULT  # noqa: E402
from verify.field import MIRAGE, Field  # noqa: E402
from verify.fuzz import MUTATIONS, corpus_graph, differs, mutate  # noqa: E402

#: the verifier's fixed pair before primes were drawn per test
FORMER = Field(2147471759, 1073735879, "former fixed")


def fixed_fooled(g, m, rng, fld: Field) -> bool | None:
    """Does one field test with the fixed pair accept the (different) mutant? None: no
    usable draw (a divisor 0 mod p in 8 draws, or a constant with no meaning mod p)."""
    try:
        return verify.field_test(g, m, rng=rng, fld=fld, max_failed_draws=8, device="cpu")[0] is None
    except (verify.ZeroDivisorDraw, verify.FieldError):
        return None


def fuzz(n: int, seed: int):
    rng = np.random.default_rng(seed)
    refs = [reference(r, small=True) for r in sorted(REFERENCES)]
    c = collections.Counter()
    per = collections.defaultdict(collections.Counter)
    t0 = time.perf_counter()
    i = 0
    while c["mutants"] < n:
        g = corpus_graph(i, rng, refs)
        i += 1
        r = mutate(g, rng)
        if r is None:
            continue
        m, name = r
        c["mutants"] += 1
        per[name]["mutants"] += 1
        truth = differs(g, m, seed=i)
        if truth is None:
            c["undecided (float64 not finite)"] += 1
            per[name]["float64 undecided"] += 1
            continue
        v = verify.equivalent(g, m, seed=i, float_check=False, device="cpu")
        if v.equivalent is None:
            c["undecided (verifier)"] += 1
            per[name]["verifier undecided"] += 1
            continue
        acc = bool(v.equivalent)
        c[f"argument: {v.argument or 'none'}"] += 1  # how the bound that decided the number of tests was argued
        if v.argument == "exponent atoms":
            c["argument: exponent atoms, different"] += bool(truth)
        key = ("accepted" if acc else "rejected") + "-but-" + ("different" if truth else "same") \
            if acc == truth else ("accepted-same" if acc else "rejected-different")
        c[key] += 1
        per[name]["different" if truth else "same"] += 1
        if truth:
            for fld, label in ((FORMER, "former"), (MIRAGE, "mirage")):
                fooled = fixed_fooled(g, m, rng, fld)
                if fooled is None:
                    c[f"{label} no usable draw"] += 1
                else:
                    c[f"{label} tried"] += 1
                    c[f"{label} fooled"] += fooled
                    per[name][f"{label} fooled"] += fooled
        if c["mutants"] % 1000 == 0:
            print(f"  … {c['mutants']} mutants, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return c, per, time.perf_counter() - t0


def _pair(build_a, build_b, inputs=("x",)):
    import mugraph as mg
    out = []
    for name, build in (("ref", build_a), ("cand", build_b)):
        p = mg.Program(name)
        xs = [p.input(n, (4, 8)) for n in inputs]
        p.output(build(*xs))
        out.append(p)
    return out


def hostile_pairs():
    """The pairs a hostile user builds around fixed primes, and the sqrt pairs: the
    verdict with random primes, with the former fixed pair, and with Mirage's."""
    from fractions import Fraction as F

    import mugraph as mg

    P, Q = FORMER.p, FORMER.q
    one = lambda x: mg.scale(x, 1)  # noqa: E731
    rms = mg.rms_norm
    yield "X·(p+1) vs X (former p)", True, _pair(lambda x: mg.scale(x, P + 1), one)
    yield "X·168 vs X (Mirage's p + 1)", True, _pair(lambda x: mg.scale(x, 168), one)
    yield "exp(X·(q+1)) vs exp(X) (former q)", True, _pair(lambda x: mg.exp(mg.scale(x, Q + 1)), mg.exp)
    yield "exp(X·(1/2 + q/2^29)) vs exp(X/2)", True, _pair(
        lambda x: mg.exp(mg.scale(x, F(1, 2) + F(Q, 2 ** 29))), lambda x: mg.exp(mg.scale(x, F(1, 2))))
    yield "X·(1 + p/2^30) vs X (numerator shares p)", True, _pair(lambda x: mg.scale(x, 1 + F(P, 2 ** 30)), one)
    yield "X·(1 + 2^30/p) vs X (denominator shares p)", True, _pair(lambda x: mg.scale(x, 1 + F(2 ** 30, P)), one)
    yield "concat([X·2^40, Y + Z·p/2^20]) vs concat([X·2^40, Y])", True, _pair(
        lambda x, y, z: mg.concat([mg.scale(x, 2 ** 40), y], 0),
        lambda x, y, z: mg.concat([mg.scale(x, 2 ** 40), y + mg.scale(z, F(P, 2 ** 20))], 0), "xyz")
    yield "(X/p)·p vs X", False, _pair(lambda x: mg.scale(mg.scale(x, F(1, P)), P), one)
    yield "(X/167)·167 vs X", False, _pair(lambda x: mg.scale(mg.scale(x, F(1, 167)), 167), one)
    yield "rms_norm(11·X) vs rms_norm(X)", False, _pair(lambda x: rms(mg.scale(x, 11)), rms)
    yield "rms_norm(13/7·X) vs rms_norm(X)", False, _pair(lambda x: rms(mg.scale(x, F(13, 7))), rms)
    yield "rms_norm(−11·X) vs rms_norm(X)", True, _pair(lambda x: rms(mg.scale(x, -11)), rms)


def _word(v) -> str:
    if v.equivalent is None:
        return "undecided"
    if v.equivalent is False:
        return "rejected"
    return "accepted" if v.bound_met else "accepted, bound not met"


def cpu_seconds() -> float:
    """CPU seconds of this process, all threads (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps: int, device) -> tuple[float, float, float]:
    """``(best wall, median wall, CPU of the best)`` seconds of ``fn()`` over ``reps`` runs
    after one untimed run (fresh memory and torch's threads start there)."""
    fn()
    runs = []
    for _ in range(reps):
        _sync(device)
        t0, c0 = time.perf_counter(), cpu_seconds()
        fn()
        _sync(device)
        runs.append((time.perf_counter() - t0, cpu_seconds() - c0))
    best = min(runs)
    return best[0], float(np.median([r[0] for r in runs])), best[1]


def time_field_test(name: str, b: int, reps: int, device: str) -> tuple[float, float, float, int]:
    """One field test of the full-size μGraph against its program as ``verify.field_test``
    runs it: draw primes, ω and inputs, evaluate both, compare. The last item counts the
    tests that found a mismatch (wrong verdicts: the pair is equivalent)."""
    g, p = reference(name, b=b), program(name, b=b)
    rng = np.random.default_rng(0)
    plan = verify.equivalence.make_plan(p, g, DEFAULT)
    wrong = [0]

    def one():
        wrong[0] += verify.field_test(p, g, rng=rng, plan=plan, device=device)[0] is not None
    return (*timed(one, reps, device), wrong[0])


def time_full_verification(name: str, b: int, device: str) -> dict:
    """``verify.equivalent`` of the full-size μGraph (2^-40, float check on): cold, then one
    more candidate against the same ``verify.Reference``. Wall, CPU and load of each."""
    import os

    g, p = reference(name, b=b), program(name, b=b)
    verify.equivalent(program(name, small=True), reference(name, small=True), seed=0, device=device)  # warm up
    out = {}
    load0 = os.getloadavg()[0]
    _sync(device)
    t0, c0 = time.perf_counter(), cpu_seconds()
    ref = verify.Reference(p, seed=1, device=device)
    v = ref.equivalent(g)
    _sync(device)
    out["cold"] = (time.perf_counter() - t0, cpu_seconds() - c0, load0, os.getloadavg()[0], v)
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), cpu_seconds()
    v = ref.equivalent(g)
    _sync(device)
    out["warm"] = (time.perf_counter() - t0, cpu_seconds() - c0, load0, os.getloadavg()[0], v)
    return out


def small_rates(seconds: float):
    """Fingerprints and full field tests per second at the small shapes; a test draws
    its primes as ``verify.equivalent`` does (the comparison's plan made once). Each row
    ends with its wrong verdicts (fingerprints that differ, tests that find a mismatch)."""
    out = []
    for name in sorted(REFERENCES):
        g, p = reference(name, small=True), program(name, small=True)
        wrong = int(verify.fingerprint(g) != verify.fingerprint(p))
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            verify.fingerprint(g)
            n += 1
        fp = n / (time.perf_counter() - t0)
        rng = np.random.default_rng(0)
        plan = verify.equivalence.make_plan(p, g, DEFAULT)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            wrong += verify.field_test(p, g, rng=rng, plan=plan, device="cpu")[0] is not None
            n += 1
        ft = n / (time.perf_counter() - t0)
        out.append((name, fp, ft, wrong))
    return out


def speed(quick: bool, device: str) -> int:
    """Print the timing tables; returns the count of wrong verdicts met on the way (every
    pair timed is equivalent, so any mismatch or failed verification is one)."""
    import os

    from verify.field import resolve_device
    dev = resolve_device(device)
    where = f"{dev.type}" + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else
                             f", {os.cpu_count()} cores, {torch.get_num_threads()} torch threads")
    reps = 2 if quick else 4
    print(f"## One field test at full size ({where}; best and median of {reps}, CPU seconds of the best; "
          f"load average {os.getloadavg()[0]:.1f} at the start)")
    print()
    print("| benchmark | b | wall (best) | wall (median) | CPU | verdicts |")
    print("|---|---|---|---|---|---|")
    bad = 0
    for name in ("gqa", "qknorm_gqa", "gated_mlp", "rmsnorm_matmul"):
        for b in (1, 8):
            best, med, cpu, wrong = time_field_test(name, b, reps, device)
            bad += wrong
            print(f"| {name} | {b} | {best:.3f} s | {med:.3f} s | {cpu:.3f} s | "
                  f"{'ok' if not wrong else f'{wrong} WRONG'} |", flush=True)
    print()
    print(f"## Full verification of b=8 μGraphs (verify.equivalent at 2^-40 with the float check; {where})")
    print()
    print("| benchmark | run | verdict | tests | wall | CPU | load average (start → end) |")
    print("|---|---|---|---|---|---|---|")
    for name in ("gqa", "gated_mlp", "rmsnorm_matmul"):
        res = time_full_verification(name, 8, device)
        for key, label in (("cold", "cold: a fresh Reference (program and candidate)"),
                           ("warm", "one more candidate against the same Reference (the search's case)")):
            wall, cpu, l0, l1, v = res[key]
            bad += not v.ok
            print(f"| {name} | {label} | {'ok' if v.ok else 'NOT OK: ' + ', '.join(v.failed_checks)} | {v.tests} | "
                  f"{wall:.2f} s | {cpu:.2f} s | {l0:.1f} → {l1:.1f} |", flush=True)
    print()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print("## Field tests per second at the small shapes (mugraph.core.benchmarks.SMALL; CPU, one thread)")
    print()
    print("| benchmark | fingerprints/s (μGraph) | full tests/s (program + μGraph) | verdicts |")
    print("|---|---|---|---|")
    for name, fp, ft, wrong in small_rates(0.5 if quick else 2.0):
        bad += wrong
        print(f"| {name} | {fp:.0f} | {ft:.0f} | {'ok' if not wrong else f'{wrong} WRONG'} |")
    torch.set_num_threads(threads)
    print()
    print(f"wrong verdicts: {bad}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="600 mutants and shorter timings")
    ap.add_argument("--mutants", type=int, default=None)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--device", default="auto", help="where the timed field arithmetic runs: auto, cpu, cuda")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--fuzz", action="store_true", help="the mutation fuzz and hostile pairs alone")
    part.add_argument("--speed", action="store_true", help="the timings alone")
    args = ap.parse_args(argv)
    n = args.mutants or (600 if args.quick else 10_000)
    bad = 0
    if not args.speed:
        bad = soundness(n, args.seed)
    if not args.fuzz:
        bad += speed(args.quick, args.device)
    return 1 if bad else 0


def soundness(n: int, seed: int) -> int:
    """The mutation fuzz and the hostile pairs (CPU, one thread); returns the count of
    false accepts plus false rejections."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small shapes: thread start-up would dominate (the search runs 1 thread/worker)
    c, per, secs = fuzz(n, seed)
    print(f"## Mutation fuzz ({c['mutants']} mutants, seed {seed}, {secs:.0f} s; a fresh pair per test from "
          f"{DEFAULT.size} safe-prime pairs, error 2^-40)")
    print()
    print("| outcome | count |")
    print("|---|---|")
    print(f"| different (float64), rejected | {c['rejected-different']} |")
    print(f"| **different, accepted (false accepts)** | **{c['accepted-but-different']}** |")
    print(f"| same function, accepted | {c['accepted-same']} |")
    print(f"| **same function, rejected (false rejections)** | **{c['rejected-but-same']}** |")
    print(f"| undecided: float64 overflows (no ground truth) | {c['undecided (float64 not finite)']} |")
    print(f"| undecided: verifier (field mismatch through sqrt or a max, float64 agrees) | "
          f"{c['undecided (verifier)']} |")
    for k in sorted(k for k in c if k.startswith("argument: ")):  # how each verdict's bound was argued
        print(f"| bound by {k[len('argument: '):]} | {c[k]} |")
    for label, what in (("former", f"the former fixed pair p={FORMER.p}, q={FORMER.q}"),
                        ("mirage", "Mirage's p=167, q=83")):
        tried = c[f"{label} tried"]
        rate = c[f"{label} fooled"] / tried if tried else 0.0
        print(f"| one test with {what} fooled by a different mutant | {c[f'{label} fooled']} of {tried} "
              f"({100 * rate:.2f}%; {c[f'{label} no usable draw']} without a usable draw) |")
    print()
    print("| mutation | mutants | different | same | undecided (float64 / verifier) | former pair fooled "
          "| Mirage fooled |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(set(MUTATIONS) | set(per)):  # every mutation, those that found no site too
        d = per[name]
        print(f"| {name} | {d['mutants']} | {d['different']} | {d['same']} | {d['float64 undecided']} / "
              f"{d['verifier undecided']} | {d['former fooled']} | {d['mirage fooled']} |")
    print()

    print("## Hostile pairs (verify.equivalent, seed 1, float check on)")
    print()
    print("| pair | differs | random primes (default) | former fixed pair | Mirage's 167/83 |")
    print("|---|---|---|---|---|")
    for label, different, (a, b) in hostile_pairs():
        cells = []
        for fld in (DEFAULT, FORMER, MIRAGE):
            v = verify.equivalent(a, b, seed=1, field=fld, device="cpu")
            cells.append(_word(v) + ("" if v.ok or v.equivalent is not True else " (not ok: "
                                     + ", ".join(v.failed_checks) + ")"))
        print(f"| {label} | {'yes' if different else 'no'} | " + " | ".join(cells) + " |")
    print()
    torch.set_num_threads(threads)
    return c["accepted-but-different"] + c["rejected-but-same"]


if __name__ == "__main__":
    from mugraph.core.errors import MugraphError
    try:
        sys.exit(main())
    except MugraphError as e:  # e.g. --device cuda where torch sees no GPU
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
