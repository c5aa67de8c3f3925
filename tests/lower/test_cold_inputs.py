"""Timing from DRAM: copies of the large inputs, cycled through call by call."""

import importlib

import pytest
import torch

import mugraph as mg
from lower import cold_inputs
from lower.cold_inputs import cycling, rotated_sets, set_count

profile = importlib.import_module("lower.profile")  # the module (``lower.profile`` is also a function)

MB = 2**20


def test_enough_sets_that_twice_the_l2_passes_between_two_uses_of_one():
    assert set_count(19 * MB, 50 * MB) == 7        # 6 other copies: 114 MB >= 100 MB
    assert set_count(100 * MB, 50 * MB) == 2       # one other copy already evicts it
    assert set_count(MB, 50 * MB) == cold_inputs.MAX_SETS
    assert set_count(0, 50 * MB) == 1              # nothing large: nothing copied
    # the memory bound: at most a quarter of what is free, in copies
    assert set_count(19 * MB, 50 * MB, free_bytes=4 * 40 * MB) == 3


def test_large_inputs_are_copied_with_their_strides_small_and_overlapping_ones_shared():
    weight_t = torch.randn(512, 1024).t()                 # 2 MB, a transposed view
    expanded = torch.randn(1, 1024).expand(1024, 1024)    # 4 MB of view over 4 KB
    xs = [torch.randn(1024, 1024), torch.randn(8), weight_t, expanded]
    sets = rotated_sets(xs, l2=4 * MB)
    assert sets[0] is xs and len(sets) == set_count(6 * MB, 4 * MB) == 3
    for s in sets[1:]:
        assert isinstance(s, list) and len(s) == 4
        assert s[0].data_ptr() != xs[0].data_ptr() and torch.equal(s[0], xs[0])
        assert s[2].data_ptr() != xs[2].data_ptr() and s[2].stride() == weight_t.stride()
        assert torch.equal(s[2], weight_t)
        assert s[1] is xs[1] and s[3] is expanded
    assert sets[1][0].data_ptr() != sets[2][0].data_ptr()


def test_a_dict_of_inputs_stays_a_dict_and_small_inputs_make_no_copies():
    small = {"x": torch.randn(4, 8), "w": torch.randn(8, 8)}
    assert rotated_sets(small, l2=4 * MB) == [small]
    big = {"x": torch.randn(1, 64), "W": torch.randn(1024, 512)}
    sets = rotated_sets(big, l2=MB)  # W is 2 MB: one other copy reads twice the L2
    assert len(sets) == 2 and all(set(s) == {"x", "W"} and s["x"] is big["x"] for s in sets)


def test_cycling_runs_one_call_per_launch_in_turn():
    seen = []
    launch = cycling([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        launch()
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    one = lambda: None  # noqa: E731
    assert cycling([one]) is one


def test_measure_on_times_one_launch_per_set(monkeypatch):
    timed = []
    monkeypatch.setattr(profile, "measure", lambda launch, timing="graph": timed.append(timing) or
                        [launch() for _ in range(4)] and 1e-6)
    made = []

    def make(s):
        made.append(s)
        return lambda: s["W"].data_ptr()

    inputs = {"W": torch.randn(1024, 512)}
    assert profile.measure_on(make, inputs, "dram") == 1e-6
    assert timed == ["graph"] and len(made) == len(rotated_sets(inputs)) > 1
    made.clear()
    profile.measure_on(make, inputs, "graph")
    assert made == [inputs] and timed == ["graph", "graph"]


def test_dram_timing_without_the_inputs_is_refused():
    with pytest.raises(ValueError, match="measure_on"):
        profile.measure(lambda: None, "dram")


def test_optimize_config_timing_is_checked_and_keys_only_when_not_the_default():
    assert "timing" not in mg.OptimizeConfig().to_json()        # keys made before the field hold
    assert mg.OptimizeConfig(timing="dram").to_json()["timing"] == "dram"
    for bad in ("cold", "fast", 3):
        with pytest.raises(mg.ConfigError, match="timing="):
            mg.OptimizeConfig(timing=bad)


def test_the_backend_tunes_its_pieces_on_inputs_from_dram():
    from mugraph.frontend.options import FrontendOptions

    assert FrontendOptions().optimize_config()["timing"] == "dram"
    assert mg.OptimizeConfig(**FrontendOptions().optimize_config()).timing == "dram"
