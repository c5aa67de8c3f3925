"""The result cache cannot hurt: names made safe, foreign and corrupt entries
recomputed (with one warning line), atomic writes under concurrent writers.

Most tests replace the pipeline by a stub that returns the unfused program as the
answer (the cache logic is what is under test, and it runs in milliseconds); the
concurrency test runs the real pipeline in four processes."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mugraph as mg
from mugraph.pipeline import optimize as opt_mod

ROOT = Path(__file__).resolve().parents[2]


def _prog(name="p", scale=2):
    p = mg.Program(name)
    x = p.input("x", (2, 4), "float32")
    p.output(mg.exp(x) * scale)
    return p


@pytest.fixture
def runs(monkeypatch):
    """Stub pipeline: the program itself is the answer; records each program it ran."""
    seen = []

    def fake(program, cfg, device, progress, seed, checkpoint_dir=None, stop_by=None, seeds=None):
        seen.append(program.name)
        c = opt_mod.Candidate(program, "program")
        return opt_mod.Optimized(program, c, [c], {"device": "cpu", "why": "stub", "error_bound": None}, device)

    monkeypatch.setattr(opt_mod, "_run_pipeline", fake)
    return seen


def _opt(p, cache, **kw):
    return mg.superoptimize(p, device="cpu", cache_dir=cache, progress=False, **kw)


def test_hit_after_miss(tmp_path, runs):
    a = _opt(_prog(), tmp_path)
    b = _opt(_prog(), tmp_path)
    assert runs == ["p"] and str(a.graph) == str(b.graph)
    (entry,) = tmp_path.glob("*.mug.json")
    assert entry.name.startswith("p-") and "cache_key" in json.loads(entry.read_text())


@pytest.mark.parametrize("name", ["../../x", "/etc/passwd", "..", "a/../../b", "con\\..\\y", "ünï cödé", ".hidden"])
def test_program_names_cannot_leave_the_cache_folder(tmp_path, runs, name):
    cache = tmp_path / "cache"
    _opt(_prog(name), cache)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name != "structures"]
    assert len(written) == 1 and written[0].parent == cache, written  # and its structure index
    assert not written[0].name.startswith(".") and "/" not in written[0].name and "\\" not in written[0].name


def test_entry_copied_under_another_key_is_recomputed(tmp_path, runs, caplog):
    """A cache entry for program A placed under program B's key is never served for B."""
    a, b = _prog("f", scale=2), _prog("f", scale=3)
    _opt(a, tmp_path)
    (entry_a,) = tmp_path.glob("*.mug.json")
    key_b = mg.pipeline.cache_key(b, mg.OptimizeConfig(), 0, "cpu")
    entry_b = tmp_path / f"f-{key_b}.mug.json"
    entry_b.write_text(entry_a.read_text())
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        got = _opt(b, tmp_path)
    assert runs == ["f", "f"]
    x = np.ones((2, 4))
    np.testing.assert_allclose(mg.evaluate(got.graph, {"x": x})[0], np.exp(x) * 3)
    (rec,) = [r for r in caplog.records if "cache" in r.getMessage()]
    assert "another program or configuration" in rec.getMessage() and "\n" not in rec.getMessage()
    assert json.loads(entry_b.read_text())["cache_key"]["program"] == mg.core.serialize.graph_to_json(b)


def test_entry_whose_program_was_edited_is_recomputed(tmp_path, runs, caplog):
    p = _prog()
    _opt(p, tmp_path)
    (entry,) = tmp_path.glob("*.mug.json")
    doc = json.loads(entry.read_text())
    doc["program"]["ops"][2]["attrs"]["c"] = "5"  # the key still says scale 2
    doc["candidates"][0]["graph"]["ops"][2]["attrs"]["c"] = "5"
    entry.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        _opt(p, tmp_path)
    assert runs == ["p", "p"] and "not the one asked for" in caplog.text


@pytest.mark.parametrize("content", ["{truncated", "", "[]", "\x00\xff", '{"format": "mugraph"}',
                                     "[" * 5000 + "]" * 5000])
def test_corrupt_entry_is_replaced(tmp_path, runs, caplog, content):
    p = _prog()
    key = mg.pipeline.cache_key(p, mg.OptimizeConfig(), 0, "cpu")
    entry = tmp_path / f"p-{key}.mug.json"
    entry.write_text(content)
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        _opt(p, tmp_path)
    assert runs == ["p"] and "recomputing" in caplog.text
    assert isinstance(mg.load(entry), mg.Optimized)  # replaced by a sound entry
    _opt(p, tmp_path)
    assert runs == ["p"]  # and served from then on


def test_unwritable_cache_costs_a_warning_not_the_result(tmp_path, runs, caplog):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        got = _opt(_prog(), blocker)
    assert isinstance(got, mg.Optimized) and "not saved" in caplog.text


def test_no_temporary_files_left(tmp_path, runs):
    for s in range(3):
        _opt(_prog(scale=s + 2), tmp_path)
    assert sorted(p.suffix for p in tmp_path.iterdir() if p.is_file()) == [".json"] * 3
    assert all(p.suffix == ".json" for p in (tmp_path / "structures").iterdir())  # the structure indexes too


_WORKER = """
import sys, mugraph as mg
p = mg.Program("tiny")
x = p.input("x", (8, 16), "float32"); w = p.input("w", (16, 16), "float32")
p.output(mg.exp(x @ w))
cfg = {"search": {"workers": 1, "time_limit": 60, "max_kernel_ops": 1, "max_block_ops": 3, "tile_sizes": [16],
                  "forloop_ranges": [4], "max_results": 1}}
opt = mg.superoptimize(p, cfg, device="cpu", cache_dir=sys.argv[1], progress=False)
print("RESULT", opt.best.origin, opt.best.num_kernels, len(opt.candidates))
"""


def test_four_processes_share_one_cache_folder(tmp_path):
    """Four processes superoptimize the same program into one folder at the same time:
    every one finishes, all agree, and one sound entry is left (no temporary files)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(cache)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    results = {next(line for line in out.splitlines() if line.startswith("RESULT")) for out, _ in outs}
    assert len(results) == 1, results
    # completed searches delete their default checkpoint: only the folder may remain
    leftover = list((cache / "checkpoints").glob("*")) if (cache / "checkpoints").exists() else []
    assert not leftover, leftover
    files = [f for f in cache.iterdir() if f.name not in ("checkpoints", "structures")]
    assert len(list((cache / "structures").iterdir())) == 1  # one structure, its index written whole
    assert len(files) == 1 and files[0].name.startswith("tiny-") and files[0].name.endswith(".mug.json"), files
    assert isinstance(mg.load(files[0]), mg.Optimized)


# ------------------------------------------------------------------ results of other code

def _cache_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "mugraph" and "cache" in r.getMessage()]


def test_entry_records_the_code_that_computed_it(tmp_path, runs):
    from mugraph.core.version import code_fingerprint

    _opt(_prog(), tmp_path)
    (entry,) = tmp_path.glob("*.mug.json")
    doc = json.loads(entry.read_text())
    assert doc["cache_key"]["versions"]["code"] == code_fingerprint()
    assert len(code_fingerprint()) == 64


def test_result_of_other_code_is_recomputed_with_one_line(tmp_path, runs, caplog, monkeypatch):
    """An upgrade (simulated: another code fingerprint) finds the old entry under the same
    name, says in one line that other code computed it, recomputes and replaces it; the
    same code is then served from the cache again."""
    from mugraph.pipeline import cache as cache_mod

    _opt(_prog(), tmp_path)
    old = cache_mod.versions()["code"]
    monkeypatch.setattr(cache_mod, "code_fingerprint", lambda: "c0de" * 16)
    with caplog.at_level(logging.INFO, logger="mugraph"):
        _opt(_prog(), tmp_path)
    assert runs == ["p", "p"]
    (line,) = _cache_lines(caplog)
    assert "recomputing p-" in line and "computed by other code" in line and "\n" not in line
    assert f"code fingerprint {old[:12]}… ≠ c0dec0dec0de…" in line
    (entry,) = tmp_path.glob("*.mug.json")  # replaced under the same name, no stale file left
    assert json.loads(entry.read_text())["cache_key"]["versions"]["code"] == "c0de" * 16
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mugraph"):
        _opt(_prog(), tmp_path)
    assert runs == ["p", "p"] and _cache_lines(caplog) == []  # the same code: a hit, silently


def test_entry_whose_fingerprint_was_edited_is_recomputed(tmp_path, runs, caplog):
    p = _prog()
    _opt(p, tmp_path)
    (entry,) = tmp_path.glob("*.mug.json")
    doc = json.loads(entry.read_text())
    doc["cache_key"]["versions"]["code"] = "0" * 64
    entry.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        _opt(p, tmp_path)
    assert runs == ["p", "p"]
    (line,) = _cache_lines(caplog)
    assert "computed by other code (code fingerprint 000000000000… ≠" in line


def test_entry_of_another_torch_says_so(tmp_path, runs, caplog):
    p = _prog()
    _opt(p, tmp_path)
    (entry,) = tmp_path.glob("*.mug.json")
    doc = json.loads(entry.read_text())
    doc["cache_key"]["versions"]["torch"] = "1.0"
    entry.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="mugraph"):
        _opt(p, tmp_path)
    (line,) = _cache_lines(caplog)
    assert runs == ["p", "p"] and "it was computed with other versions (torch 1.0 ≠" in line
    assert "other code" not in line


def test_the_backend_asks_the_cache_as_superoptimize_does(tmp_path, runs, caplog, monkeypatch):
    """torch.compile's pieces: whether a piece is served from the cache (no 'new search'
    line, no deadline) is decided by the same lookup and checks as ``superoptimize`` — an
    entry of other code is not a hit — and asking logs nothing."""
    from types import SimpleNamespace

    from mugraph.frontend.options import FrontendOptions
    from mugraph.frontend.pieces import _row_major
    from mugraph.frontend.run import _is_cached, optimize_config
    from mugraph.pipeline import cache as cache_mod

    p = _prog()
    opts = FrontendOptions(cache_dir=str(tmp_path), time_limit=2.0, seed=3)
    piece = SimpleNamespace(program=p, strided={})
    assert not _is_cached(piece, opts, "cpu")
    mg.superoptimize(p, optimize_config(piece, opts), device="cpu", cache_dir=str(tmp_path), progress=False,
                     seed=opts.seed)
    assert _is_cached(piece, opts, "cpu")
    # the same Program arriving with a transposed input is another question (tuned on its layout)
    strided = SimpleNamespace(program=p, strided={p.inputs[0].name: tuple(reversed(_row_major(p.inputs[0].shape)))})
    assert not _is_cached(strided, opts, "cpu")
    monkeypatch.setattr(cache_mod, "code_fingerprint", lambda: "f" * 64)
    with caplog.at_level(logging.INFO, logger="mugraph"):
        assert not _is_cached(piece, opts, "cpu")
    assert _cache_lines(caplog) == []


def test_fingerprint_covers_code_and_data_not_caches_or_the_frontend(tmp_path):
    from mugraph.core.version import fingerprint_of_packages

    pkgs = {"mugraph": tmp_path / "mugraph", "lower": tmp_path / "lower"}
    for f, text in [("mugraph/core/ir.py", "x = 1"), ("mugraph/frontend/run.py", "y = 1"),
                    ("lower/data/timing.csv", "a,b"), ("lower/plan.py", "z = 1")]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(text)
    base = fingerprint_of_packages(pkgs)
    assert fingerprint_of_packages(pkgs) == base

    def changed(f: str, text: str) -> bool:
        path = tmp_path / f
        before = path.read_bytes() if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        try:
            return fingerprint_of_packages(pkgs) != base
        finally:
            path.unlink() if before is None else path.write_bytes(before)

    assert changed("mugraph/core/ir.py", "x = 2") and changed("lower/plan.py", "z = 2")
    assert changed("lower/data/timing.csv", "a,c") and changed("lower/new.py", "")
    assert not changed("mugraph/frontend/run.py", "y = 2")      # decides which programs, not results
    assert not changed("lower/__pycache__/plan.cpython-312.pyc", "bytecode")
    assert not changed("lower/notes.txt", "a stray file")
    assert fingerprint_of_packages({**pkgs, "verify": None}) != base  # a missing package counts too
