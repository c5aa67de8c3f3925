"""Bad use of superoptimize gets clear errors before any search runs."""

import json

import pytest

import mugraph as mg
from mugraph.core.benchmarks import program, reference


def test_non_lax_program():
    p = mg.Program("twice")
    x = p.input("x", (4, 4))
    p.output(mg.exp(mg.exp(x)))
    with pytest.raises(mg.NotLaxError, match="second exponentiation"):
        mg.superoptimize(p, cache_dir=False)


def test_not_a_program():
    with pytest.raises(TypeError, match="expected a mugraph Program"):
        mg.superoptimize("gated_mlp")
    with pytest.raises(mg.ConfigError, match="already holds graph-defined kernels"):
        mg.superoptimize(reference("lora", small=True), cache_dir=False)
    p = mg.Program("empty")
    p.input("x", (2, 2))
    with pytest.raises(mg.ConfigError, match="has no outputs"):
        mg.superoptimize(p, cache_dir=False)


@pytest.mark.parametrize("cfg,msg", [
    ({"error": 0}, r"error=0: the false-accept bound must lie in \(0, 1\)"),
    ({"error": 2}, r"error=2"),
    ({"top_k": 0}, r"top_k=0"),
    ({"search": {"max_block_ops": 0}}, r"search.max_block_ops=0: must be a positive int"),
    ({"search": {"max_kernel_ops": -1}}, r"search.max_kernel_ops=-1"),
    ({"search": {"time_limit": 0}}, r"search.time_limit=0: must be a number of seconds > 0"),
    ({"search": {"forloop_ranges": []}}, r"search.forloop_ranges=\[\]"),
    ({"search": {"workers": 0}}, r"search.workers=0"),
])
def test_impossible_config(cfg, msg):
    with pytest.raises(mg.ConfigError, match=msg) as e:
        mg.superoptimize(program("lora", small=True), cfg, cache_dir=False)
    assert "\n" not in str(e.value)


def test_bad_device():
    with pytest.raises(mg.ConfigError, match="device='tpu'"):
        mg.superoptimize(program("lora", small=True), device="tpu", cache_dir=False)


def test_corrupt_and_foreign_results(tmp_path):
    bad = tmp_path / "r.mug.json"
    bad.write_text("{oops")
    with pytest.raises(mg.CacheError, match="unreadable cached result"):
        mg.pipeline.load_result(bad)
    bad.write_text(json.dumps({"format": "mugraph", "kind": "Optimized", "version": 7}))
    with pytest.raises(mg.CacheError, match="not a saved mugraph result of version 1"):
        mg.load(bad)
    bad.write_text(json.dumps({"format": "mugraph", "kind": "Optimized", "version": 1, "device": "cpu",
                               "program": {"format": "mugraph"}, "candidates": [], "best": 0, "report": {}}))
    with pytest.raises(mg.CacheError, match="saved result is invalid"):
        mg.load(bad)
