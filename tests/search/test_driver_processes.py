"""The search driver as a user runs it, in subprocesses: scripts without a main guard and code
piped to ``python -`` finish within their time limit + 10 s with the guarded run's graphs; a
SIGKILLed worker's task is reported and a SIGSTOPped (stuck) one cannot hold the result past the
limit + 10 s; SIGINT to the process group returns the best so far, writes the checkpoint, and a
rerun resumes from it; the CLI prints one line and exits 130 on Ctrl-C.

Each child runs with ``PYTHONPATH`` set to this checkout, so it tests this code."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the contract: ``search.run`` returns within ``time_limit`` + this many seconds
SLACK = 10.0

BODY = """
import json, sys, time
import mugraph as mg
import search
from mugraph.core.benchmarks import program

kw = json.loads(sys.argv[1])
if kw.pop("bench", False):
    p = program("rmsnorm_matmul", small=True)
else:
    p = mg.Program("expmm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32)); V = p.input("V", (64, 32))
    p.output(mg.exp(X @ W) * (X @ V))
t0 = time.monotonic()
r = search.run(p, search.SearchConfig(**kw))
print("RESULT " + json.dumps({"graphs": r.graph_json, "stats": r.stats, "seconds": time.monotonic() - t0}))
"""
GUARDED = "def main():\n" + textwrap.indent(BODY, "    ") + "\n\nif __name__ == '__main__':\n    main()\n"
SMALL = dict(max_kernel_ops=1, max_block_ops=5, tile_sizes=[16], forloop_ranges=[4], verify_error=1e-3,
             progress=False, workers=2, time_limit=60.0)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _result(stdout: str) -> dict:
    lines = [s for s in stdout.splitlines() if s.startswith("RESULT ")]
    assert lines, stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def _start(args: list, cfg: dict, cwd: Path, stdin: str | None = None) -> subprocess.Popen:
    """Start ``python ARGS CONFIG``; ``stdin``: text piped to it (for ``python -``)."""
    src = cwd / "stdin.py"
    src.write_text(stdin or "")
    with open(src) as f:
        return subprocess.Popen([sys.executable, *args, json.dumps(cfg)], stdin=f, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd)


def _finish(proc: subprocess.Popen, limit: float) -> dict:
    try:
        out, err = proc.communicate(timeout=limit + 60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return _result(out)


def _run(args: list, cfg: dict, cwd: Path, stdin: str | None = None) -> dict:
    return _finish(_start(args, cfg, cwd, stdin), cfg["time_limit"])


#: the comparison's runs verify one graph each: the enumeration is complete and ordered, but
#: how many verifications fit the time depends on the machine's load (three searches share it)
COMPARED = {**SMALL, "verify_per_kernels": 1}


def _guarded_reference() -> list:
    """The graphs of the guarded run: this test process is one (pytest guards its main)."""
    import mugraph as mg
    import search

    p = mg.Program("expmm")
    X = p.input("X", (8, 64)); W = p.input("W", (64, 32)); V = p.input("V", (64, 32))
    p.output(mg.exp(X @ W) * (X @ V))
    r = search.run(p, search.SearchConfig(**COMPARED))
    assert r.stats["complete"] and r.graph_json
    return r.graph_json


def test_unguarded_script_and_stdin_give_the_guarded_graphs(tmp_path):
    (tmp_path / "unguarded.py").write_text(BODY)
    runs = {"script": _start(["unguarded.py"], COMPARED, tmp_path), "stdin": _start(["-"], COMPARED, tmp_path, BODY)}
    ref = _guarded_reference()
    for how, proc in runs.items():
        r = _finish(proc, COMPARED["time_limit"])
        assert r["seconds"] <= COMPARED["time_limit"] + SLACK
        assert r["graphs"] == ref, how
        assert r["stats"]["complete"] and not r["stats"]["failed_tasks"] and not r["stats"]["worker_failures"]


# ------------------------------------------------------------- process tree

def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _cpu_seconds(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _workers(pid: int) -> list[int]:
    """The search workers of process ``pid``: the children of its forkserver."""
    servers = [c for c in _children(pid) if "forkserver" in _cmdline(c)]
    return [w for s in servers for w in _children(s)]


def _busy_workers(proc: subprocess.Popen, n: int, cpu: float, limit: float = 60.0) -> list[int]:
    """Wait until ``n`` workers have spent ``cpu`` seconds (a worker forked from the server
    is ready after a few milliseconds of its own: the rest is a task)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        ws = [w for w in _workers(proc.pid) if _cpu_seconds(w) >= cpu]
        if len(ws) >= n:
            return ws[:n]
        time.sleep(0.2)
    raise AssertionError("the search workers never got busy")


def test_killed_and_stuck_workers_cannot_hold_the_result(tmp_path):
    """One worker SIGKILLed (its task retried and reported), the other SIGSTOPped (stuck for
    good): the result still arrives within the limit + 10 s."""
    (tmp_path / "s.py").write_text(GUARDED)
    cfg = dict(bench=True, max_kernel_ops=1, max_block_ops=9, progress=False, workers=2, time_limit=10.0,
               verify_reserve=0.0, max_verify=1)
    proc = subprocess.Popen([sys.executable, "s.py", json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        killed, stopped = _busy_workers(proc, 2, cpu=0.3)
        os.kill(killed, signal.SIGKILL)
        os.kill(stopped, signal.SIGSTOP)
        out, err = proc.communicate(timeout=cfg["time_limit"] + 60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    r = _result(out)
    st = r["stats"]
    assert r["seconds"] <= cfg["time_limit"] + SLACK
    assert any(f["error"] == f"worker pid {killed} killed by SIGKILL" and isinstance(f["task"], int)
               for f in st["worker_failures"]), {k: st[k] for k in ("worker_failures", "tasks_cut", "search_seconds",
                                                                   "wall_seconds", "tasks_done")}
    assert st["tasks_cut"] >= 1 or any(str(stopped) in f["error"] for f in st["worker_failures"])
    assert not st["complete"]
    with pytest.raises(ProcessLookupError):  # the stuck worker was terminated, not left behind
        for _ in range(50):
            os.kill(stopped, 0)
            time.sleep(0.1)


def test_sigint_returns_best_so_far_and_a_rerun_resumes(tmp_path):
    (tmp_path / "s.py").write_text(GUARDED)
    ck = tmp_path / "search.ckpt.json"
    cfg = dict(bench=True, max_kernel_ops=1, max_block_ops=8, progress=False, workers=2, time_limit=120.0,
               checkpoint=str(ck))
    proc = subprocess.Popen([sys.executable, "s.py", json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path, start_new_session=True)
    try:
        end = time.monotonic() + 90
        while not ck.exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        assert ck.exists() and proc.poll() is None, "no checkpoint before the search ended"
        t_sig = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, err = proc.communicate(timeout=60)
        after_sigint = time.monotonic() - t_sig
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    r = _result(out)
    assert r["stats"]["interrupted"] and not r["stats"]["complete"]
    assert after_sigint < SLACK
    doc = json.loads(ck.read_text())
    saved = len(doc["done"])
    assert 0 < saved < r["stats"]["tasks"]
    assert r["stats"]["tasks_done"] == saved  # every finished task is in the checkpoint
    # the rerun starts from the checkpoint (a short limit: it need not finish)
    again = _run(["s.py"], {**cfg, "time_limit": 5.0}, tmp_path)
    assert again["stats"]["tasks_resumed"] == saved and again["stats"]["tasks_done"] >= saved
    assert not again["stats"]["interrupted"]


def test_cli_ctrl_c_is_one_line_and_exit_130(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        from mugraph.core.benchmarks import program
        p = program("rmsnorm_matmul", small=True)
    """))
    err_path = tmp_path / "err.txt"
    with open(err_path, "w") as err_f:
        proc = subprocess.Popen([sys.executable, "-m", "mugraph", "optimize", "prog.py", "--device", "cpu", "--no-cache",
                                 "--time-limit", "120", "--max-kernel-ops", "1", "--max-block-ops", "9"],
                                stdout=subprocess.PIPE, stderr=err_f, text=True, env=_env(), cwd=tmp_path,
                                start_new_session=True)
        try:
            end = time.monotonic() + 90
            # the search phase has begun: its bar on a terminal, its phase line in a file
            while (not any(m in err_path.read_text() for m in ("search (", "search: search"))
                   and time.monotonic() < end and proc.poll() is None):
                time.sleep(0.2)
            assert proc.poll() is None, err_path.read_text()[-3000:]
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGINT)
            out, _ = proc.communicate(timeout=90)
        finally:
            proc.kill()
    err = err_path.read_text()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = [s for s in err.replace("\r", "\n").splitlines() if s.strip()][-1]
    assert last.startswith(("interrupted", "superoptimize: interrupted")), last
