"""The benchmark table on several GPUs of one machine (``python -m mugraph bench --gpus``;
``examples/generality.py --gpu --gpus`` uses the same).

Each row of the table is one search (CPU-bound, one process per worker) followed by GPU
work (re-ranking, timings). On a machine with several GPUs the rows run side by side,
one ``mugraph bench`` process per GPU, each row of a GPU after the other. So that a row
measures what it would on a machine with one GPU and fewer cores, every GPU's process
sees only that GPU (``CUDA_VISIBLE_DEVICES``) and runs on its own share of the physical
cores (CPU affinity, :func:`core_groups`): its search workers do not compete with
another row's, and its timings are taken on a card nothing else uses. The rows'
``bench.csv`` lines are merged into one file in the table's order.
"""

from __future__ import annotations

import csv
import glob
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

from ..core.errors import ConfigError


#: the status of a job killed at its time limit (as the ``timeout`` command reports it)
TIMED_OUT = 124


def physical_cores(cpus: Sequence[int] | None = None,
                   siblings: Callable[[int], str] | None = None) -> list[list[int]]:
    """The logical CPUs this process may run on (``cpus``; default its affinity),
    grouped by physical core (hyper-threads of one core together), in CPU order.
    ``siblings(cpu)`` gives a CPU's ``thread_siblings_list`` (default: read from
    ``/sys``); where it cannot be read every CPU is a core of its own."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)

    def from_sys(c: int) -> str:
        with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
            return f.read().strip()

    cores: dict[str, list[int]] = {}
    for c in cpus:
        try:
            key = (siblings or from_sys)(c)
        except OSError:
            key = str(c)
        cores.setdefault(key, []).append(c)
    return sorted(cores.values(), key=min)


def core_groups(n: int, cores: list[list[int]] | None = None) -> list[list[int]]:
    """``n`` disjoint sets of logical CPUs, each of whole physical cores, as equal in
    size as the cores allow (the first groups get one more core when they do not
    divide evenly). Fewer cores than ``n``: a one-line :class:`ConfigError`."""
    cores = physical_cores() if cores is None else cores
    if n < 1:
        raise ConfigError(f"core_groups: n={n} must be at least 1")
    if len(cores) < n:
        raise ConfigError(f"bench --gpus: {n} GPUs need at least {n} CPU cores, this process may use {len(cores)}")
    k, extra = divmod(len(cores), n)
    out, at = [], 0
    for g in range(n):
        take = k + (g < extra)
        out.append(sorted(c for core in cores[at:at + take] for c in core))
        at += take
    return out


def assign(jobs: Sequence, n: int) -> list[list]:
    """``jobs`` dealt to ``n`` queues in turn (the table's order within each queue): rows
    of one program at several batch sizes land on different GPUs."""
    return [list(jobs[g::n]) for g in range(n)]


def parse_gpus(spec: str, available: int) -> list[int]:
    """``--gpus``: ``all`` or a comma-separated list of CUDA device indices."""
    if available < 1:
        raise ConfigError("bench --gpus: torch sees no CUDA device")
    if spec.strip().lower() == "all":
        return list(range(available))
    try:
        gpus = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"bench --gpus {spec!r}: use 'all' or device indices such as 0,1,2") from None
    bad = [g for g in gpus if not 0 <= g < available]
    if not gpus or bad or len(set(gpus)) != len(gpus):
        raise ConfigError(f"bench --gpus {spec!r}: use 'all' or distinct device indices in 0..{available - 1}")
    return gpus


THREAD_POOLS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
"""The variables that size a process's thread pools when their libraries load: torch's and
numba's OpenMP pools, numpy's BLAS. A row's process gets its CPU share in each, said
outright rather than left to each library's reading of the affinity mask (torch's OpenMP
pool counts the machine's cores unless told)."""


def thread_env(threads: int) -> dict[str, str]:
    """Environment entries that give a new process ``threads`` threads in every pool of
    :data:`THREAD_POOLS`."""
    return {name: str(threads) for name in THREAD_POOLS}


def run_queues(queues: list[list], gpus: list[int], groups: list[list[int]],
               command: Callable[[object, int, Path], list[str]], out: Path,
               echo: Callable[[str], None] = print, timeout: float | None = None) -> list[int]:
    """Run each GPU's queue in a process of its own, the jobs of a queue one after the
    other: ``command(job, workers, folder)`` is the argv of one job (``workers``: the
    size of the queue's CPU share; ``folder``: where it writes). Each process sees only
    its GPU and runs on its CPU share. Their output lines are echoed as they come,
    prefixed by the GPU. A job still running after ``timeout`` seconds is killed (status
    :data:`TIMED_OUT`, one line saying so): a hung row never holds up the table. Returns
    each queue's exit statuses (one per job run; a queue stops at its first failing job).
    Ctrl-C stops every queue."""
    statuses: list[list[int]] = [[] for _ in queues]
    procs: list[subprocess.Popen | None] = [None] * len(queues)
    stop = threading.Event()

    def run(q: int) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpus[q]), **thread_env(len(groups[q]))}
        for i, job in enumerate(queues[q]):
            if stop.is_set():
                return
            argv = command(job, len(groups[q]), out / f"gpu{gpus[q]}-{i}")
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 preexec_fn=lambda cpus=frozenset(groups[q]): os.sched_setaffinity(0, cpus))
            procs[q] = p
            timer = None
            if timeout is not None:
                timer = threading.Timer(timeout, p.kill)
                timer.start()
            for line in p.stdout:
                echo(f"[gpu{gpus[q]}] {line.rstrip()}")
            code = p.wait()
            if timer is not None:
                timer.cancel()
                if code == -9 and not stop.is_set():
                    echo(f"[gpu{gpus[q]}] {job} killed after {timeout:g} s")
                    code = TIMED_OUT
            statuses[q].append(code)
            if statuses[q][-1] != 0:
                return

    threads = [threading.Thread(target=run, args=(q,), daemon=True) for q in range(len(queues))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        for p in procs:
            if p is not None and p.poll() is None:
                p.terminate()
        raise
    return [s for q in statuses for s in q]


def merge_csv(out: Path, order: Callable[[dict], tuple], name: str = "bench.csv") -> list[dict]:
    """The ``name`` CSV lines of every job folder under ``out``, sorted by ``order``,
    written to ``out/name``; returns them."""
    rows, cols = [], None
    for path in sorted(glob.glob(str(out / "gpu*" / name))):
        with open(path, newline="") as f:
            r = csv.DictReader(f)
            cols = cols or r.fieldnames
            rows += list(r)
    rows.sort(key=order)
    if cols:
        with open(out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    return rows


def bench_argv(name: str, b: int, workers: int, folder: Path, passthrough: list[str]) -> list[str]:
    """One row's ``python -m mugraph bench`` command line."""
    return [sys.executable, "-m", "mugraph", "bench", "--name", name, "--batch", str(b), "--workers", str(workers),
            "--out", str(folder), *passthrough]
