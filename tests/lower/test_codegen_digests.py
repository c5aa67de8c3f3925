"""The generated Triton stays identical (comments aside): the stored subset of
``lower.digests`` units is regenerated and compared record by record.

``python -m lower.digests`` runs the same comparison over every unit (every
benchmark reference μGraph × every recorded and tunable config, about 118 000)."""

from __future__ import annotations

import pytest

from lower import digests
from lower.config import KernelConfig


@pytest.fixture(scope="module")
def stored():
    return digests.load()


def test_subset_is_identical(stored):
    data, records = stored
    specs = {g.key: g for g in digests.graphs()}
    ctxs: dict[str, digests.GraphContext] = {}
    now = {}
    for key in records:
        spec, unit = digests.parse_key(key, specs)
        ctx = ctxs.get(spec.key) or ctxs.setdefault(spec.key, digests.GraphContext(spec))
        now[key] = ctx.record(unit)
    report = digests.first_difference(records, now)
    assert report is None, f"generated code differs from the record (code {data['code']}): {report}"


def test_stored_data_covers_every_graph_and_feature(stored):
    data, records = stored
    graphs = {g.key for g in digests.graphs()}
    assert {k.split(" | ")[0] for k in data["groups"]} == graphs
    assert {k.split(" | ")[0] for k in records} == graphs
    assert sum(n for n, _ in data["groups"].values()) == data["units"] > 100_000
    specs = {g.key: g for g in digests.graphs()}
    units = [digests.parse_key(k, specs)[1] for k in records]
    cfgs = [u.config for u in units]
    # every way of lowering a block the tuner may pick is in the recomputed subset
    assert {c.small_mm for c in cfgs} == {"dot", "v", "va"}
    assert {c.combine for c in cfgs if c.split > 1} == {"kernel", "last"}
    assert any(c.chunk > 1 for c in cfgs) and any(c.sub for c in cfgs)
    assert {c.split_loads for c in cfgs} == {c.stage_all_loads for c in cfgs} == {True, False}
    assert {u.flavour for u in units} == {"", "pdl", "interpret"}


def test_normalize_drops_comments_only():
    src = 'x = tl.load(p, cache_modifier=".cg")  # note\n    # a line\n\ny = "#"  \n'
    assert digests.normalize(src) == 'x = tl.load(p, cache_modifier=".cg")\ny = "#"\n'


def test_a_changed_kernel_is_named_with_a_diff():
    old = {"g | k3:w4s3": "a = 1\nb = 2\n", "g | k3:w4s3k2": "c = 3\n"}
    new = dict(old, **{"g | k3:w4s3": "a = 1\nb = 3\n"})
    report = digests.first_difference(old, new)
    assert report.startswith("g | k3:w4s3: differs") and "-b = 2" in report and "+b = 3" in report
    assert digests.first_difference(old, dict(old)) is None
    assert "no longer generated" in digests.first_difference(old, {"g | k3:w4s3k2": "c = 3\n"})
    assert "new" in digests.first_difference(old, dict(old, **{"g | k4:w4s3": ""}))


def test_unit_keys_round_trip():
    specs = {g.key: g for g in digests.graphs()}
    ctx = digests.GraphContext(next(iter(specs.values())))
    for u in list(ctx.units(digests.recorded_configs()))[:200]:
        assert digests.parse_key(u.key, specs)[1] == u
        assert u.group.startswith(f"{u.graph} | k{u.kernel}:w*s*")
    assert digests.Unit("g", 3, KernelConfig(num_warps=8, num_stages=5, chunk=2, stage_all_loads=True)).group \
        == "g | k3:w*s*c2*"
