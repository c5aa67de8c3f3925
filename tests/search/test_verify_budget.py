"""The verification budget: cheapest first, round-robin over kernel counts, as many as
the time left allows at the measured cost of one verification."""

import time
from collections import Counter

import pytest

import mugraph as mg
from mugraph.core.errors import ConfigError
from mugraph.core.serialize import graph_to_json
from search import verification
from search.run_state import VerifyCost
from search.config import SearchConfig
from search.records import Match


def _match(kernels: int, cost: float, sig: str, i: int) -> Match:
    p = mg.Program(f"k{kernels}-{cost}-{sig}")
    p.output(p.input("x", (2, 2)) * 2)
    return Match((kernels, cost), i, 0, graph_to_json(p), sig, "enumeration")


MATCHES = [_match(1, 3.0, "gd", 0), _match(1, 1.0, "gd", 1), _match(1, 2.0, "mm+gd", 2), _match(2, 5.0, "gd+gd", 3),
           _match(2, 4.0, "gd+gd", 4), _match(3, 9.0, "gd+gd+gd", 5)]


def test_order_is_round_robin_over_kernel_counts():
    names = [m.graph["name"] for m in verification.order(MATCHES)]
    # per count: cheapest first, signatures alternating; counts interleaved
    assert names == ["k1-1.0-gd", "k2-4.0-gd+gd", "k3-9.0-gd+gd+gd", "k1-2.0-mm+gd", "k2-5.0-gd+gd", "k1-3.0-gd"]
    assert verification.order([]) == []


class _Answers:
    def __init__(self, ok=lambda m: True):
        self.ok, self.asked = ok, []

    def get(self, order, pos, ahead):
        self.asked.append(pos)
        return {"equivalent": self.ok(order[pos])}


def test_per_kernel_cap_and_result_order():
    cfg = SearchConfig(max_verify=None, verify_per_kernels=1, thread_graphs=False, progress=False)
    src = _Answers()
    found, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES), src)
    assert [f.graph["name"] for f in found] == ["k1-1.0-gd", "k2-4.0-gd+gd", "k3-9.0-gd+gd+gd"]
    assert st["verifications"] == 3 and st["unverified_matches"] == 3
    # a failure (a fingerprint false positive) lets the next of its count in; results by kernel count
    src = _Answers(ok=lambda m: m.graph["name"] != "k1-1.0-gd")
    found, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES), src)
    assert [f.graph["name"] for f in found] == ["k1-2.0-mm+gd", "k2-4.0-gd+gd", "k3-9.0-gd+gd+gd"]
    assert st["verify_failed"] == 1 and st["verify_unevaluated"] == 0
    # no verdict at all (the verifier could not evaluate it) is counted apart from a disagreement
    src = _Answers()
    src.get = lambda order, pos, ahead: None if order[pos].graph["name"] == "k1-1.0-gd" else {"equivalent": True}
    found, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES), src)
    assert [f.graph["name"] for f in found] == ["k1-2.0-mm+gd", "k2-4.0-gd+gd", "k3-9.0-gd+gd+gd"]
    assert st["verify_unevaluated"] == 1 and st["verify_failed"] == 0
    cfg = SearchConfig(max_verify=2, verify_per_kernels=None, thread_graphs=False, progress=False)
    found, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES), _Answers())
    assert [f.graph["name"] for f in found] == ["k1-1.0-gd", "k2-4.0-gd+gd"] and st["verifications"] == 2


def test_a_graph_that_fails_its_float_check_takes_no_place_of_the_cap():
    """Equal in exact arithmetic, unusable in floats (a shift by another tile's max): it is
    returned with its verdict, and the next graph of its count is verified too."""
    cfg = SearchConfig(max_verify=None, verify_per_kernels=1, thread_graphs=False, progress=False)

    class _FloatFails(_Answers):
        def get(self, order, pos, ahead):
            self.asked.append(pos)
            bad = order[pos].graph["name"] == "k1-1.0-gd"
            return {"equivalent": True, "float_check": {"passed": not bad}}

    found, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES), _FloatFails())
    names = [f.graph["name"] for f in found]
    assert names[:2] == ["k1-1.0-gd", "k1-2.0-mm+gd"] and st["verified_float_failed"] == 1
    assert "k2-4.0-gd+gd" in names and "k1-3.0-gd" not in names


class _FakeChecker:
    """The checker as the verdict sources use it: one verification takes `cost` seconds."""

    def __init__(self, cost: float):
        self.cost = cost
        self.started: list[float] = []

    def verdict(self, graph):
        self.started.append(time.monotonic())
        time.sleep(self.cost)
        return None


def _budget(left: float | None) -> VerifyCost:
    return VerifyCost(None if left is None else time.monotonic() + left)


def test_verification_stops_when_the_next_would_overrun_the_limit():
    budget = _budget(1.0)
    src = verification.LocalVerdicts(_FakeChecker(0.3), budget)
    order = verification.order(MATCHES)
    cfg = SearchConfig(max_verify=None, verify_per_kernels=None, thread_graphs=False, progress=False)
    t0 = time.monotonic()
    _, st = verification.verify_best(order, cfg, len(order), src)
    # 0.3 s each in 1 s: three fit (the fourth would end after the limit), the rest are skipped
    assert st["verifications"] == 3 and st["verify_skipped_time"] == 3
    assert time.monotonic() - t0 < 1.0 + 0.2
    assert len(budget.seconds) == 3 and min(budget.seconds) >= 0.3


def test_no_time_limit_verifies_to_the_caps():
    cfg = SearchConfig(max_verify=None, verify_per_kernels=None, thread_graphs=False, progress=False)
    _, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES),
                                   verification.LocalVerdicts(_FakeChecker(0.0), _budget(None)))
    assert st["verifications"] == len(MATCHES) and st["verify_skipped_time"] == 0


def test_fits_uses_the_median_cost():
    budget = _budget(10.0)
    assert budget.fits()
    budget.seconds = [1.0, 30.0, 2.0]
    assert budget.fits()  # median 2 s
    budget.seconds = [30.0, 20.0, 2.0]
    assert not budget.fits()  # median 20 s > 10 s left
    budget.t_end = time.monotonic() - 1
    budget.seconds = []
    assert not budget.fits()


def test_the_first_verification_on_a_gpu_runs_past_the_limit():
    """Verifications here on a GPU cost 0.01–0.05 s: a search whose earlier phases ran to its
    limit still verifies its cheapest candidate, and only that one."""
    budget = VerifyCost(time.monotonic() - 1, first_past_end=True)
    assert budget.fits()
    src = verification.LocalVerdicts(_FakeChecker(0.0), budget)
    cfg = SearchConfig(max_verify=None, verify_per_kernels=None, thread_graphs=False, progress=False)
    _, st = verification.verify_best(verification.order(MATCHES), cfg, len(MATCHES), src)
    assert st["verifications"] == 1 and st["verify_skipped_time"] == len(MATCHES) - 1
    assert not VerifyCost(time.monotonic() - 1).fits()


@pytest.mark.parametrize("field,value", [("max_verify", 0), ("verify_per_kernels", 0), ("verify_per_kernels", 1.5)])
def test_budget_fields_are_checked(field, value):
    with pytest.raises(ConfigError, match=field):
        SearchConfig(**{field: value})


def test_budget_defaults_scale_with_the_time():
    cfg = SearchConfig()
    assert cfg.max_verify is None and cfg.verify_per_kernels == 8
    assert SearchConfig(verify_per_kernels=None).verify_per_kernels is None
    assert Counter(k for k in cfg.key() if k.startswith("verify")) == Counter(
        ["verify_error", "verify_per_kernels", "verify"])


def test_a_verifier_error_on_one_candidate_is_a_warning_and_no_verdict(monkeypatch, caplog):
    """An unexpected exception inside the verifier (a bug, or an analysis that overflows)
    costs that candidate its verdict, with one warning line; the search goes on."""
    import verify
    from search.check import Checker

    p = mg.Program("tiny")
    x = p.input("X", (4, 8))
    p.output(mg.exp(x))
    ck = Checker(p)

    def boom(self, graph, **kw):
        raise OverflowError("numerical result out of range")

    monkeypatch.setattr(verify.Reference, "equivalent", boom)
    with caplog.at_level("WARNING", logger="mugraph"):
        assert ck.verdict(p) is None and ck.verified(p) is False
    assert "tiny" in caplog.text and "OverflowError" in caplog.text
