"""Every public entry point of the verifier refuses a bad argument with a one-line
MugraphError that names it — no traceback from numpy/torch, no silent coercion."""

import math

import numpy as np
import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks import program, reference
from verify.floatcheck import compare_float64
from verify.fuzz import mutate, random_program, random_ugraph, rewrite, with_large_part

P = program("lora", small=True)
G = reference("lora", small=True)


def _two():
    p = mg.Program("t")
    x = p.input("x", (2, 3))
    p.output(x + x)
    return p


T = _two()

CASES = {
    # equivalent
    "error=5": (lambda: verify.equivalent(T, T, error=5), "error"),
    "error=0": (lambda: verify.equivalent(T, T, error=0), "error"),
    "error=1": (lambda: verify.equivalent(T, T, error=1), "error"),
    "error=nan": (lambda: verify.equivalent(T, T, error=math.nan), "error"),
    "error='1e-9'": (lambda: verify.equivalent(T, T, error="1e-9"), "error"),
    "error=True": (lambda: verify.equivalent(T, T, error=True), "error"),
    "seed=-1": (lambda: verify.equivalent(T, T, seed=-1), "seed"),
    "seed=1.5": (lambda: verify.equivalent(T, T, seed=1.5), "seed"),
    "seed='3'": (lambda: verify.equivalent(T, T, seed="3"), "seed"),
    "max_tests=0": (lambda: verify.equivalent(T, T, max_tests=0), "max_tests"),
    "max_tests=2.0": (lambda: verify.equivalent(T, T, max_tests=2.0), "max_tests"),
    "max_tests=True": (lambda: verify.equivalent(T, T, max_tests=True), "max_tests"),
    "max_failed_draws=0": (lambda: verify.equivalent(T, T, max_failed_draws=0), "max_failed_draws"),
    "field=str": (lambda: verify.equivalent(T, T, field="mirage"), "field"),
    "field=tuple": (lambda: verify.equivalent(T, T, field=(167, 83)), "field"),
    "float_check=1": (lambda: verify.equivalent(T, T, float_check=1), "float_check"),
    "non_lax": (lambda: verify.equivalent(T, T, non_lax="ignore"), "non_lax"),
    "float_kwargs=list": (lambda: verify.equivalent(T, T, float_kwargs=[1]), "float_kwargs"),
    "float_kwargs bad dtype": (lambda: verify.equivalent(T, T, seed=0, float_kwargs={"dtypes": ["int8"]}), "int8"),
    "reference not a graph": (lambda: verify.equivalent("p.json", T), "reference"),
    "candidate not a graph": (lambda: verify.equivalent(T, None), "candidate"),
    "numpy array as graph": (lambda: verify.equivalent(T, np.zeros(3)), "candidate"),
    # field_test / fingerprint / per_test_bound
    "field_test rng=int": (lambda: verify.field_test(T, T, rng=3), "rng"),
    "field_test rng=None": (lambda: verify.field_test(T, T, rng=None), "rng"),
    "field_test fld=int": (lambda: verify.field_test(T, T, rng=np.random.default_rng(0), fld=167), "field"),
    "field_test draws=0": (lambda: verify.field_test(T, T, rng=np.random.default_rng(0), max_failed_draws=0),
                           "max_failed_draws"),
    "field_test mismatch": (lambda: verify.field_test(T, P, rng=np.random.default_rng(0)), "inputs differ"),
    "fingerprint seed=-2": (lambda: verify.fingerprint(T, seed=-2), "seed"),
    "fingerprint seed=0.0": (lambda: verify.fingerprint(T, seed=0.0), "seed"),
    "fingerprint field": (lambda: verify.fingerprint(T, field="default"), "field"),
    "per_test_bound fld": (lambda: verify.per_test_bound(T, T, 7), "field"),
    # float_check
    "dtypes str": (lambda: verify.float_check(T, T, dtypes="float16"), "dtypes"),
    "dtypes empty": (lambda: verify.float_check(T, T, dtypes=()), "dtypes"),
    "dtypes int8": (lambda: verify.float_check(T, T, dtypes=("int8",)), "int8"),
    "dtypes float64": (lambda: verify.float_check(T, T, dtypes=("float64",)), "float64"),
    "scales empty": (lambda: verify.float_check(T, T, scales=[]), "scales"),
    "scale 0": (lambda: verify.float_check(T, T, scales=[0]), "scale"),
    "scale -1": (lambda: verify.float_check(T, T, scales=[-1.0]), "scale"),
    "scale inf": (lambda: verify.float_check(T, T, scales=[math.inf]), "scale"),
    "scale str": (lambda: verify.float_check(T, T, scales=["1"]), "scale"),
    "float seed": (lambda: verify.float_check(T, T, seed=-1), "seed"),
    "tolerances list": (lambda: verify.float_check(T, T, tolerances=[0.1]), "tolerances"),
    "tolerance dtype": (lambda: verify.float_check(T, T, tolerances={"fp16": 0.1}), "fp16"),
    "tolerance 0": (lambda: verify.float_check(T, T, tolerances={"float16": 0}), "tolerance"),
    "slack 0.5": (lambda: verify.float_check(T, T, slack=0.5), "slack"),
    "float_check mismatch": (lambda: verify.float_check(P, T), "inputs differ"),
    # compare_float64
    "compare seed": (lambda: compare_float64(T, T, seed=-1), "seed"),
    "compare draws": (lambda: compare_float64(T, T, draws=0), "draws"),
    "compare scale": (lambda: compare_float64(T, T, scale=0), "scale"),
    "compare rtol": (lambda: compare_float64(T, T, rtol=-1e-7), "rtol"),
    # verify_files
    "verify_files int": (lambda: verify.verify_files(3), "ref_path"),
    "verify_files cand": (lambda: verify.verify_files("a.json", 4.5), "cand_path"),
    "verify_files missing": (lambda: verify.verify_files("/nonexistent/a.json", "/nonexistent/b.json"),
                             "no such file"),
    "verify_files suffix": (lambda: verify.verify_files(__file__.replace(".py", ".txt")), "no such file"),
    # primes
    "Field composite": (lambda: verify.Field(15, 7), "prime"),
    "Field q not dividing": (lambda: verify.Field(167, 7), "divide"),
    "Field too large": (lambda: verify.Field(2 ** 31 + 11, 3), "2**31"),
    "Field str": (lambda: verify.Field("167", "83"), "ints"),
    "PrimeFamily q_lo": (lambda: verify.PrimeFamily(5, 100, 3), "q_lo"),
    "PrimeFamily size": (lambda: verify.PrimeFamily(17, 100, 0), "size"),
    "PrimeFamily float": (lambda: verify.PrimeFamily(17.0, 100, 3), "q_lo"),
    "PrimeFamily too big": (lambda: verify.PrimeFamily(17, 2 ** 31, 3), "2**30"),
    "draw rng": (lambda: verify.DEFAULT.draw(42), "rng"),
    "draw avoid str": (lambda: verify.DEFAULT.draw(np.random.default_rng(0), avoid="12"), "avoid"),
    "draw avoid float": (lambda: verify.DEFAULT.draw(np.random.default_rng(0), avoid=[1.5]), "avoid"),
    "draw squares 1": (lambda: verify.DEFAULT.draw(np.random.default_rng(0), squares=[1]), "squares"),
    "draw squares many": (lambda: verify.DEFAULT.draw(np.random.default_rng(0), squares=[17, 19, 23, 29]),
                          "too many"),
    # fuzz
    "random_program seed": (lambda: random_program(-1), "rng"),
    "random_program seed float": (lambda: random_program(1.5), "rng"),
    "random_program max_ops": (lambda: random_program(0, max_ops=0), "max_ops"),
    "random_program sizes": (lambda: random_program(0, sizes=()), "sizes"),
    "random_program sizes 0": (lambda: random_program(0, sizes=(0, 2)), "sizes"),
    "random_ugraph n": (lambda: random_ugraph(0, n=1), "n"),
    "mutate kind": (lambda: mutate(T, 0, kinds=["nonsense"]), "unknown mutation"),
    "mutate kinds str": (lambda: mutate(T, 0, kinds="scale"), "kinds"),
    "mutate tries": (lambda: mutate(T, 0, tries=0), "tries"),
    "rewrite steps": (lambda: rewrite(T, 0, steps=-1), "steps"),
    "with_large_part dim": (lambda: with_large_part(T, dim=2), "dim"),
    "with_large_part graph": (lambda: with_large_part("T"), "expected a Program"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_argument_is_a_one_line_mugraph_error(name):
    call, needle = CASES[name]
    with pytest.raises(mg.MugraphError) as e:
        call()
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_good_arguments_still_work():
    assert verify.equivalent(T, T, error=0.5, seed=np.int64(3), max_tests=np.int32(2), float_check=False).ok
    assert verify.fingerprint(T, seed=np.int64(0)) == verify.fingerprint(T)
    assert with_large_part(T, dim=1).outputs[0].shape == (2, 6)
