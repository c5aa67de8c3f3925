"""lower.tuning_order: which layouts are one step apart, and the cost model's error learned
per field value. No GPU needed."""

import math

from lower.config import KernelConfig
from lower.tuning_order import ErrorModel, is_layout_step, layout_steps


def K(label: str) -> KernelConfig:
    return KernelConfig.from_label(label)


def test_layout_steps_change_one_layout_field_by_one_step():
    a = K("w4s3k4L")
    for b in ("w4s3k8L", "w4s3k2L", "w4s3k4", "w4s3c2k4L", "w4s3k4Lp1:2", "w4s3k4Lv"):
        assert is_layout_step(a, K(b)), b
    for b in ("w4s3k16L", "w4s3k4L", "w4s3c4k4L", "w4s3k8", "w4s3c2k8L", "w4s3k4Lp1:4", "w4s3k4Lp1:2x2:2"):
        assert not is_layout_step(a, K(b)), b
    # from or to no split-K, the combine comes with the split
    assert is_layout_step(K("w4s3"), K("w4s3k2L")) and is_layout_step(K("w4s3k2"), K("w4s3"))
    # warps, stages and staging are the sweep's, not the layout's
    assert is_layout_step(a, K("w8s4k8LA"))


def test_layout_steps_keep_the_base_staging_where_the_layout_has_it():
    base = K("w2s5k4LA")
    layouts = [K("w4s3k8L"), K("w4s3k8LA"), K("w4s3k2L"), K("w4s3k16LA")]
    got = layout_steps(base, layouts)
    assert {c.label() for c in got} == {"w4s3k8LA", "w4s3k2L"}


def test_error_model_learns_a_field_value_that_measures_far_slower_than_predicted():
    e = ErrorModel()
    assert e.corrected(K("w4s3c2k4L"), 1.0) == 1.0  # nothing measured: the model's own prediction
    for label, measured in (("w4s3k2L", 1.0), ("w4s3k4L", 0.9), ("w4s3c2k2L", 30.0), ("w4s3c2", 25.0),
                            ("w4s3", 1.2)):
        e.observe(K(label), 1.0, measured)
    assert e.corrected(K("w4s3c2k4L"), 1.0) > 5 * e.corrected(K("w4s3k8L"), 1.0)
    assert e.corrected(K("w4s3k8L"), 1.0) < 2.0
    # no prediction: nothing learned, nothing corrected
    e.observe(K("w4s3c4"), math.inf, 1.0)
    assert e.corrected(K("w4s3c16"), math.inf) == math.inf


def test_a_split_step_reaches_the_next_factor_the_loop_offers():
    """A 264-step loop splits 2, 3, 4, 6, 8, 11, 12, 22 or 24 ways: from 8 the next factors are
    6 and 11 (and 4 by halving); 12 is two steps away. A climb over measured times with one
    valley (Phi-3-mini's decode attention, H200: 33.6 μs at 8, 32.4 at 11, 30.6 at 12, 41.8 at
    22) walks from 8 to 12 and stops there."""
    splits = (2, 3, 4, 6, 8, 11, 12, 22, 24)
    layouts = [K(f"w4s3k{k}L") for k in splits]
    assert {c.split for c in layout_steps(K("w4s3k8L"), layouts)} == {4, 6, 11}
    assert is_layout_step(K("w4s3k8L"), K("w4s3k11L"), splits)
    assert not is_layout_step(K("w4s3k8L"), K("w4s3k11L"))  # without the loop's factors: doubling only
    assert not is_layout_step(K("w4s3k8L"), K("w4s3k12L"), splits)
    assert not is_layout_step(K("w4s3k8L"), K("w4s3k11"), splits)  # a split step keeps the combine
    measured = {4: 51.5, 6: 43.1, 8: 33.6, 11: 32.4, 12: 30.6, 22: 41.8, 24: 44.2}
    cur, seen = 8, [8]
    while True:
        best = min((c.split for c in layout_steps(K(f"w4s3k{cur}L"), layouts) if c.split in measured),
                   key=measured.__getitem__)
        seen.append(best)
        if measured[best] >= measured[cur]:
            break
        cur = best
    assert cur == 12 and seen[:3] == [8, 11, 12]
