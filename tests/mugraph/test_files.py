"""mugraph.core.files: atomic writes under concurrent writers, bounded JSON, safe names;
and the benchmark table's saved results checked like cache entries."""

import json
import logging
import threading

import pytest

import mugraph as mg
from mugraph.core import files, limits
from mugraph.pipeline import bench
from mugraph.pipeline import optimize as opt_mod


def test_concurrent_writers_of_one_file_never_collide(tmp_path):
    """Eight threads rewrite one file 25 times each: no writer fails on another's
    temporary file, the file always holds one whole document, no temporary is left."""
    target = tmp_path / "entry.json"
    errors, seen = [], []

    def writer(i):
        for k in range(25):
            try:
                files.write_text_atomic(target, json.dumps({"writer": i, "k": k, "pad": "x" * 20000}))
                seen.append(json.loads(target.read_text())["writer"])
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(repr(e))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(seen) == 200 and [p.name for p in tmp_path.iterdir()] == ["entry.json"]


@pytest.mark.parametrize("name,safe", [("../../x", "x"), ("..", "unnamed"), ("/etc/passwd", "etc_passwd"),
                                       ("a b/c", "a_b_c"), (".hidden", "hidden"), ("", "unnamed"),
                                       ("ok-name_1.2", "ok-name_1_2"), ("x" * 100, "x" * 64),
                                       ("c:\\w\\..\\y", "c_w_y"), ("ünï", "n")])
def test_safe_name(name, safe):
    assert files.safe_name(name) == safe


def test_json_limits(monkeypatch, tmp_path):
    assert files.json_depth({"a": [[1], {"b": []}]}) == 4
    assert files.loads("[" * 64 + "]" * 64) is not None
    with pytest.raises(mg.SerializationError, match="nested 65 levels deep > 64"):
        files.loads("[" * 65 + "]" * 65)
    with pytest.raises(mg.SerializationError, match="number literal of 65 characters"):
        files.loads("1" * 65)
    assert files.loads("1" * 64) == int("1" * 64)
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 100)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(["x" * 200]))
    with pytest.raises(mg.SerializationError, match=r"\d+ bytes > 100 \(mugraph.core.limits.MAX_JSON_BYTES\)"):
        files.read_json(big)


def test_the_limits_hold_what_the_project_writes(tmp_path):
    """The deepest document the project writes (a saved result with verdicts and
    search stats) is far inside MAX_JSON_DEPTH."""
    from mugraph.core.benchmarks import program, reference

    c = opt_mod.Candidate(reference("qknorm_gqa"), "search", verified={"notes": ["a"], "tests": [{"x": [1]}]},
                          configs={3: {"num_warps": 4, "sub": [[0, 2]]}})
    opt = opt_mod.Optimized(program("qknorm_gqa"), c, [c], {"search": {"stats": {"a": {"b": [1]}}}}, "cpu")
    doc = json.loads(json.dumps(opt.to_json()))
    assert files.json_depth(doc) <= limits.MAX_JSON_DEPTH // 4
    back = mg.load(opt.save(tmp_path / "r.json"))
    assert str(back.graph) == str(opt.graph) and back.best.configs == {3: {"num_warps": 4, "sub": [[0, 2]]}}


def _stub(calls):
    def fake(prog, config, **kw):
        calls.append((prog.name, kw))
        c = opt_mod.Candidate(prog, "program")
        return opt_mod.Optimized(prog, c, [c], {"device": "cpu", "why": "stub", "error_bound": None}, "cpu")
    return fake


def test_bench_passes_seed_and_cache_and_checks_saved_results(tmp_path, monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(bench, "superoptimize", _stub(calls))
    rows, _ = bench.run_bench(["lora"], (1,), tmp_path, progress=False, seed=5, cache_dir=False)
    assert calls == [("lora", {"device": "cpu", "progress": False, "seed": 5, "cache_dir": False})]
    assert rows[0].name == "lora" and rows[0].predicted_us > 0
    saved = tmp_path / "lora-b1.mug.json"
    bench.run_bench(["lora"], (1,), tmp_path, progress=False)
    assert len(calls) == 1  # the saved result is used
    other = tmp_path / "x.json"
    mg.save(opt_mod.Optimized.from_json(json.loads(saved.read_text())), other)
    doc = json.loads(other.read_text())
    doc["program"]["ops"][0]["shape"] = [32, 256]  # another program (b = 2's rows) under b = 1's name
    saved.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        bench.run_bench(["lora"], (1,), tmp_path, progress=False)
    assert len(calls) == 2 and "holds another program" in caplog.text


@pytest.mark.parametrize("kw,msg", [({"names": "lora"}, "must be a list of benchmark names"),
                                     ({"names": ["nope"]}, "unknown benchmark"),
                                     ({"batches": (0,)}, r"batches=\(0,\)"), ({"timing": "hot"}, "timing='hot'"),
                                     ({"top_k": 0}, "top_k=0"), ({"tune_seconds": -1}, "tune_seconds=-1")])
def test_bench_arguments(kw, msg, monkeypatch):
    monkeypatch.setattr(bench, "superoptimize", _stub([]))
    args = {"names": ["lora"], "batches": (1,), **kw}
    with pytest.raises(mg.MugraphError, match=msg):
        bench.run_bench(args.pop("names"), args.pop("batches"), None, **args)
