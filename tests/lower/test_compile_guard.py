"""The bound on the assembler while kernels are tuned (``lower.compile_guard``): a child
named ``ptxas`` that runs past the bound is killed — the tuner then sees a configuration
that does not compile — and other children are left alone."""

import shutil
import subprocess
import sys
import time

import pytest

from lower import compile_guard
from lower.compile_guard import bounded_compiles, children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _sleeper(tmp_path, name):
    exe = tmp_path / name
    shutil.copy(shutil.which("sleep"), exe)
    return str(exe)


def test_a_long_assembler_is_stopped_and_others_are_not(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_guard, "POLL_S", 0.1)
    ptxas, other = _sleeper(tmp_path, "ptxas"), _sleeper(tmp_path, "sleeper")
    t0 = time.monotonic()
    with bounded_compiles(limit_s=0.5):
        slow = subprocess.Popen([ptxas, "30"])
        bystander = subprocess.Popen([other, "30"])
        assert slow.pid in children() and bystander.pid in children()
        code = slow.wait(timeout=10)
    assert code == -9 and time.monotonic() - t0 < 10
    assert bystander.poll() is None  # not an assembler: untouched
    bystander.kill()
    bystander.wait()


def test_a_quick_assembler_finishes_and_the_watcher_stops(tmp_path):
    ptxas = _sleeper(tmp_path, "ptxas")
    with bounded_compiles(limit_s=5):
        assert subprocess.run([ptxas, "0.2"]).returncode == 0
    assert compile_guard._depth == 0 and compile_guard._stop is None
    after = subprocess.Popen([ptxas, "1.5"])  # outside the block nothing watches
    assert after.wait(timeout=10) == 0


def test_tritons_dump_of_a_failed_assembler_is_left_out_and_other_output_is_not(capsys):
    """Triton prints a failed ``ptxas``'s whole PTX (tens of thousands of lines) to standard
    output before raising; under the bound that one print is dropped, the rest passes."""
    ptx = "\n".join(f"\tld.global.v4.b32 {{%r{i}}}, [%rd{i}];" for i in range(5000))
    dump = (f"\n\n{'=' * 64}\n`ptxas` failed with error code -9\n`ptxas` stderr:\n\nRepro command: ptxas x.ptx\n\n"
            f"{ptx}\n{'=' * 64}\nplease share the reproducer above with Triton project.\n")
    with bounded_compiles(limit_s=30):
        print("before")
        print(dump)
        print("after")
    print("outside")
    out = capsys.readouterr().out
    assert out == "before\n\nafter\noutside\n"
