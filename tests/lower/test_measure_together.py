"""The final timings of a table row: every variant timed in the same rounds, in turn."""

import importlib

import pytest

profile = importlib.import_module("lower.profile")  # the module (``lower.profile`` is also a function)


def test_variants_are_timed_in_turn_each_round_and_reported_by_their_median(monkeypatch):
    calls = []
    # each variant's times over its rounds; "b" has one outlier round that a mean would keep
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([10.0, 11.0, 90.0])}

    def fake_measure(launch, timing="graph"):
        name = launch()
        calls.append(name)
        return next(times[name])

    monkeypatch.setattr(profile, "measure", fake_measure)
    out = profile.measure_together({"a": lambda: "a", "b": lambda: "b"}, rounds=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]  # interleaved: a drift hits both alike
    assert out == {"a": 2.0, "b": 11.0}


def test_no_rounds_is_refused():
    with pytest.raises(ValueError, match="rounds"):
        profile.measure_together({"a": lambda: None}, rounds=0)
