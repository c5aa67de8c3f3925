"""Generated Triton modules are loaded from memory: no file in a shared folder can put
code into a compiled program."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import lower
import mugraph as mg
from lower import runtime
from mugraph.core.benchmarks import reference

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_come_from_memory_not_files():
    g = reference("ntrans", small=True)
    prog = lower.compile(g, device="cpu")
    fn = prog.steps[0].fns[0] if prog.steps[0].fns else next(s.fns[0] for s in prog.steps if s.fns)
    src_file = getattr(fn, "fn", fn).__code__.co_filename
    assert src_file.startswith("<mugraph-lower ") and src_file.endswith(">")
    assert prog.module.__mugraph_source__ == prog.triton_source()
    # the same source twice gives the same module (Triton keeps its compiled kernels)
    assert runtime._load_module(prog.triton_source(), True) is prog.module


def test_a_cached_module_with_other_source_is_never_reused():
    src = "X = 1\n"
    mod = runtime._load_module(src, True)
    mod.__mugraph_source__ = "X = 2\n"  # as if the entry had been tampered with
    again = runtime._load_module(src, True)
    assert again is not mod and again.X == 1


_RUN = """
import json, sys, torch, lower, mugraph as mg
g = mg.load(sys.argv[1])
prog = lower.compile(g, device="cpu")
gen = torch.Generator().manual_seed(0)
xs = [torch.randn(t.shape, generator=gen, dtype=torch.float16) for t in g.inputs]
y = prog(*xs)
ref = mg.evaluate(g, {t.name: x for t, x in zip(g.inputs, xs)})[0]
print(json.dumps({"source_sha1": __import__("hashlib").sha1(prog.triton_source().encode()).hexdigest()[:16],
                  "err": float((y.double() - ref.double()).abs().max())}))
"""


def test_poisoned_module_in_the_shared_temp_folder_is_never_executed(tmp_path):
    """Earlier builds imported ``$TMPDIR/mugraph_lower_<uid>/mg_<sha1>.py`` without a
    check, so a line appended there ran on the next ``lower.compile``. Plant exactly
    that file, poisoned, then compile and run in a fresh process: the poison never
    runs, the result is right, and nothing is written to the temporary folder."""
    g = reference("ntrans", small=True)
    saved = mg.save(g, tmp_path / "g.json")
    shared = tmp_path / "shared_tmp"
    folder = shared / f"mugraph_lower_{os.getuid()}"
    folder.mkdir(parents=True)
    source = lower.compile(g, device="cpu").triton_source()  # what the fresh process generates, too
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    marker = tmp_path / "POISON_RAN"
    (folder / f"mg_{digest}.py").write_text(source + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    before = sorted(p.name for p in shared.rglob("*"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(shared), "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", _RUN, str(saved)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["source_sha1"] == digest  # the planted file sits exactly where the old loader looked
    assert not marker.exists(), "the planted module was executed"
    assert out["err"] < 1e-2
    assert sorted(p.name for p in shared.rglob("*")) == before  # nothing written there


def test_compiled_program_is_correct_after_linecache_is_cleared():
    """Triton reads kernel source through linecache; a cleared cache (doctest, IPython
    do it) must not leave a compiled program without its source."""
    import linecache

    g = reference("ntrans", small=True)
    lower.compile(g, device="cpu")  # the first compile registers the source with linecache
    linecache.clearcache()
    prog2 = lower.compile(g, device="cpu")
    xs = [torch.randn(t.shape).half() for t in g.inputs]
    y = prog2(*xs)
    ref = mg.evaluate(g, {t.name: x for t, x in zip(g.inputs, xs)})[0]
    assert float((y.double() - ref.double()).abs().max()) < 1e-2
