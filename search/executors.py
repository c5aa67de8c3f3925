"""Executors: where the search's payloads run (:mod:`search.worker` says what a payload is).

The driver (:mod:`search.driver`) owns the schedule — which task next, retries,
deadlines, merging results in task order — and an executor only runs payloads:

* ``submit(index, payload)`` when ``idle() > 0``; ``wait(timeout)`` returns the
  :class:`Outcome` of every payload that finished (a value, the one-line error of an
  exception, or ``died`` when its worker was lost); ``close()`` ends every worker at
  once, whatever it is doing — local worker processes that are idle and answer at once
  wait for the process's next search instead (:data:`IDLE_EXIT_S`).

Three implementations, chosen by ``SearchConfig.executor``; for a seed and a space
searched to completion they return the same graphs in the same order, because every
payload's answer is deterministic and the driver merges by task index:

* :class:`SerialExecutor` — in this process (no isolation: a deadline is only
  cooperative, Ctrl-C stops the task at once).
* :class:`ProcessExecutor` — local worker processes, the default. Workers start from
  the ``forkserver`` (``spawn`` where there is none): the server process imports
  :mod:`search` once and forks each worker from that clean state, so a worker starts
  in milliseconds instead of the 2–3 s of importing torch, egglog and z3 again, and no
  worker is ever forked from the caller's process (which may hold egglog's Rust
  threads: fork after them can deadlock). The caller's main module is hidden from
  :mod:`multiprocessing` while a worker starts, so workers never re-run it — scripts
  without an ``if __name__ == "__main__":`` guard, ``python -``, ``python -c`` and
  notebooks all work. Each worker has its own pipe, so the driver knows which task a
  worker holds: a worker that dies (killed, crashed) is seen through its process
  sentinel, its task is handed back as ``died`` (the driver retries it once), and one
  worker is replaced, not the pool. ``multiprocessing.Pool`` respawns a dying worker
  forever and cannot say which task was lost; ``concurrent.futures.ProcessPoolExecutor``
  marks the whole pool broken on one death (every task in flight lost, every worker
  restarted) and cannot terminate one stuck worker, and its exit handler joins workers,
  so a stuck one blocks interpreter exit. Workers ignore SIGINT (Ctrl-C reaches the
  whole process group; the driver decides what it means) and exit when the driver's
  process is gone.
* :class:`RayExecutor` — one Ray actor per worker on a Ray cluster (``ray_address``,
  or the cluster ``ray.init()`` connects to or starts). The shared state (program,
  config, e-graph tables) is put into Ray's object store once (``ray.put``) and each
  actor reads it once when it starts; a payload carries only its task. A lost actor
  (node failure, killed process) surfaces as ``died``.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from typing import Any, Optional, Protocol

from mugraph.core.errors import ConfigError, MugraphError

from verify import shared_draws

from .config import SearchConfig
from .worker import WorkerState, share_cores

#: ``SearchConfig.executor`` values
EXECUTORS = ("processes", "serial", "ray")


class WorkerError(MugraphError):
    """Search workers cannot start (the first one's error is named)."""


@dataclass
class Outcome:
    """What became of one payload: ``value`` (the worker's answer), or ``error`` (one line)."""

    index: int
    value: Optional[dict] = None
    error: str = ""
    #: True when the worker was lost while holding the payload (the payload itself may be fine)
    died: bool = False


class Executor(Protocol):
    name: str
    #: payloads in flight at most
    capacity: int

    def start(self, shared: dict[str, Any]) -> None: ...
    def idle(self) -> int: ...
    def busy(self) -> list[int]: ...
    def submit(self, index: int, payload: dict) -> None: ...
    def wait(self, timeout: float) -> list[Outcome]: ...
    def close(self) -> None: ...


def make_executor(kind: str, workers: int, *, ray_address: Optional[str] = None,
                  state: Optional[WorkerState] = None) -> Executor:
    """The executor ``SearchConfig.executor`` names (``state``: the serial executor's searcher)."""
    if kind == "serial":
        return SerialExecutor(state)
    if kind == "processes":
        return ProcessExecutor(workers)
    if kind == "ray":
        return RayExecutor(workers, ray_address)
    raise ConfigError(f"executor={kind!r}: use one of {', '.join(EXECUTORS)}")


def one_line(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


# ------------------------------------------------------------------- serial

class SerialExecutor:
    """Runs each payload in this process, inside :meth:`wait`."""

    name = "serial"
    capacity = 1

    def __init__(self, state: Optional[WorkerState] = None) -> None:
        self._state = state
        self._queue: deque[tuple[int, dict]] = deque()

    def start(self, shared: dict[str, Any]) -> None:
        if self._state is None:
            self._state = WorkerState(shared)

    def idle(self) -> int:
        return 0 if self._queue else 1

    def busy(self) -> list[int]:
        return [i for i, _ in self._queue]

    def submit(self, index: int, payload: dict) -> None:
        self._queue.append((index, payload))

    def wait(self, timeout: float) -> list[Outcome]:
        if not self._queue:
            return []
        index, payload = self._queue.popleft()
        assert self._state is not None
        try:
            return [Outcome(index, self._state.handle(payload))]
        except Exception as e:  # noqa: BLE001 - surfaced to the driver as the task's error
            return [Outcome(index, error=one_line(e))]

    def close(self) -> None:
        self._queue.clear()


# ---------------------------------------------------------------- processes

@contextlib.contextmanager
def _main_module_hidden():
    """While a worker starts, ``__main__`` is a bare module: :mod:`multiprocessing` then
    sends no main path or name to the child, which therefore does not re-run the
    caller's script (a script without a main guard would search again in every worker,
    and ``python -`` has no file to re-run at all)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while a process is forked and exec'd: the child starts with SIGINT
    ignored (an ignored signal stays ignored across exec, and Python then installs no
    KeyboardInterrupt handler), so a Ctrl-C that reaches the whole process group while it
    imports cannot print a traceback from it. Only the main thread may change handlers;
    elsewhere this does nothing (the worker ignores SIGINT once it runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def prestart() -> None:
    """Start the workers' fork server now, where there is one: it imports the search on its
    own (about 2 s), and the first search's first worker waits for it. A caller with other
    work before its first search (the torch.compile backend: its ATen capture) starts it
    first, so the two overlap; the first search of a process otherwise spent those seconds of
    its share waiting (2 CPU cores: its first match at 3.1 s, the next search's at 1.1 s)."""
    _start_context()


def _start_context():
    if "forkserver" in mp.get_all_start_methods():
        from multiprocessing import forkserver

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["search.worker"])
        with _sigint_ignored(), _main_module_hidden():
            forkserver.ensure_running()  # fork + exec only: the server imports on its own
        return ctx
    return mp.get_context("spawn")


def _process_main(conn, parent_pid: int) -> None:
    """A worker process: greet, receive the shared state, then answer payloads until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    try:
        _serve(conn)
    except (EOFError, OSError):
        return  # the driver closed the pipe (it is done, or gone): nothing to report to


def _serve(conn) -> None:
    """Greet; then, for each search this worker serves, build its state from the ``init``
    message and answer payloads until ``stop``. A stop names how long to wait for the next
    search's ``init`` (:data:`IDLE_EXIT_S`; 0: exit now); past it the worker exits."""
    conn.send(("hello", os.getpid()))
    msg = conn.recv()
    while msg[0] == "init":
        try:
            share_cores(SearchConfig.from_json(msg[1]["config"]).workers)
            state = WorkerState(msg[1])
        except Exception as e:  # noqa: BLE001 - reported to the driver, which names it
            conn.send(("init_failed", one_line(e)))
            return
        conn.send(("ready", os.getpid()))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, index, payload = msg
            try:
                reply = ("done", index, state.handle(payload))
            except Exception as e:  # noqa: BLE001 - the task's error goes back to the driver
                reply = ("error", index, one_line(e))
            conn.send(reply)
        del state
        shared_draws.use(None)  # the search's shared draws are removed with it
        shared_draws.release()
        wait_s = msg[1] if len(msg) > 1 else 0.0
        if not wait_s:
            return
        conn.send(("idle", os.getpid()))  # the driver keeps only workers that say so
        if not conn.poll(wait_s):
            return
        msg = conn.recv()


def _exit_with_parent(parent_pid: int) -> None:
    """End this worker when the driver's process is gone (killed, or exited without closing)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid and not _alive(parent_pid):
            os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Proc:
    def __init__(self, proc, conn) -> None:
        self.proc, self.conn = proc, conn
        self.ready = False
        self.task: Optional[int] = None
        self.payload: Optional[dict] = None
        self.sent = False


#: seconds the driver waits for its idle workers to say they are waiting for the next search
IDLE_ACK_S = 1.0

#: seconds a worker whose search ended waits for the next search of its process before it
#: exits (:data:`_IDLE`)
IDLE_EXIT_S = 300.0

#: workers whose search ended, waiting for the next search of this process: (worker, when it
#: was stopped). Starting a worker costs the driver's thread about 0.45 s on a busy 16-core
#: machine (the fork server forks it while the other workers run), so the fifteenth of a
#: search's workers started 6.7 s after the first — a quarter of a 12 s search's worker time;
#: a process that searches again (the torch.compile backend: one search per piece) takes
#: these instead, ready at once.
_IDLE: list[tuple["_Proc", float]] = []
_IDLE_LOCK = threading.Lock()


def _take_idle(n: int) -> list["_Proc"]:
    """Up to ``n`` workers from :data:`_IDLE` that are alive and not about to exit."""
    out = []
    with _IDLE_LOCK:
        while _IDLE and len(out) < n:
            w, since = _IDLE.pop()
            if w.proc.is_alive() and time.monotonic() - since < IDLE_EXIT_S * 0.8:
                out.append(w)
            else:
                _end(w)
    return out


#: seconds the idle workers have to exit on their own when the driver exits: a worker tears
#: its interpreter down in milliseconds on an idle machine, but at 1 s a test run of four
#: processes on two cores saw one still exiting, killed, and its semaphore reported leaked
EXIT_GRACE_S = 5.0


@atexit.register
def _end_idle_workers() -> None:
    """At the driver's exit, the idle workers told to exit and given :data:`EXIT_GRACE_S` to do so
    (the wait ends as soon as they have).
    Why: they are daemon processes, which multiprocessing's own exit handler (run after this
    one) terminates with a signal, and a worker ended so leaves numba's thread-launch lock —
    a named semaphore under the spawn context — registered: Python then warned of leaked
    semaphores at every exit of a process that had searched. Exiting on their own, they
    unlink it."""
    with _IDLE_LOCK:
        idle = [w for w, _ in _IDLE]
        _IDLE.clear()
    for w in idle:
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(("stop", 0.0))
    end = time.monotonic() + EXIT_GRACE_S
    for w in idle:
        w.proc.join(max(0.0, end - time.monotonic()))
        with contextlib.suppress(OSError):
            w.conn.close()


def _end(w: "_Proc") -> None:
    """Stop a worker that holds no task: tell it to exit, and make sure it does."""
    with contextlib.suppress(OSError, ValueError):
        w.conn.send(("stop", 0.0))
    w.proc.join(0.5)
    if w.proc.is_alive():
        w.proc.kill()
        w.proc.join(1.0)
    with contextlib.suppress(OSError):
        w.conn.close()


class ProcessExecutor:
    """Local worker processes (see the module docstring for how they start and die). Workers
    idle at the end of a search wait for the process's next search (:data:`_IDLE`)."""

    name = "processes"

    def __init__(self, workers: int) -> None:
        self.capacity = max(1, workers)
        self._ctx: Any = None
        self._procs: list[_Proc] = []
        self._shared: Optional[dict] = None
        self._deaths_before_ready = 0
        self._any_ready = False
        #: seconds from a worker's start to its first "ready" (for the statistics)
        self.startup_seconds: list[float] = []

    def start(self, shared: dict[str, Any]) -> None:
        self._shared = shared  # workers start on demand, at their first payload
        self._ctx = _start_context()
        for w in _take_idle(self.capacity):  # an earlier search's workers: this search's state
            w.ready, w.task, w.payload, w.sent = False, None, None, False
            w.started = time.monotonic()  # type: ignore[attr-defined]
            try:
                w.conn.send(("init", shared))
            except (OSError, ValueError):
                _end(w)
                continue
            self._procs.append(w)

    def idle(self) -> int:
        return self.capacity - len(self.busy())

    def busy(self) -> list[int]:
        return [p.task for p in self._procs if p.task is not None]

    def submit(self, index: int, payload: dict) -> None:
        w = next((p for p in self._procs if p.task is None), None) or self._spawn()
        w.task, w.payload, w.sent = index, payload, False
        if w.ready:
            self._send(w)

    def _spawn(self) -> _Proc:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=_process_main, args=(child, os.getpid()), daemon=True,
                              name="mugraph-search-worker")
        if self._ctx.get_start_method() == "forkserver":
            with _main_module_hidden():
                p.start()  # the server forks it; it starts with the server's SIGINT disposition
        else:
            with _sigint_ignored(), _main_module_hidden():
                p.start()
        child.close()
        w = _Proc(p, parent)
        w.started = time.monotonic()  # type: ignore[attr-defined]
        self._procs.append(w)
        return w

    def _send(self, w: _Proc) -> None:
        try:
            w.conn.send(("task", w.task, w.payload))
            w.sent = True
        except (OSError, ValueError):
            pass  # the worker is gone: its sentinel reports it

    def wait(self, timeout: float) -> list[Outcome]:
        if not self._procs:
            time.sleep(max(0.0, min(timeout, 0.05)))
            return []
        objs = [w.conn for w in self._procs] + [w.proc.sentinel for w in self._procs]
        ready = set(mp_wait(objs, timeout))
        out: list[Outcome] = []
        for w in list(self._procs):
            if w.conn in ready:
                self._receive(w, out)
            if w.proc.sentinel in ready or not w.proc.is_alive():
                while self._poll(w) and self._receive(w, out):
                    pass  # what it sent before it died
                self._bury(w, out)
        return out

    @staticmethod
    def _poll(w: _Proc) -> bool:
        try:
            return w.conn.poll()
        except (OSError, ValueError):
            return False

    def _receive(self, w: _Proc, out: list[Outcome]) -> bool:
        """Handle one message from ``w``; False when there is none (the pipe is closed)."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError, ValueError):
            return False  # the sentinel decides
        kind = msg[0]
        if kind == "hello":
            w.conn.send(("init", self._shared))
        elif kind == "ready":
            w.ready = True
            self._any_ready = True
            self.startup_seconds.append(round(time.monotonic() - w.started, 3))  # type: ignore[attr-defined]
            if w.task is not None and not w.sent:
                self._send(w)
        elif kind == "init_failed":
            self.close()
            raise WorkerError(f"search worker failed to start: {msg[1]}")
        elif kind in ("done", "error") and msg[1] == w.task:
            out.append(Outcome(w.task, msg[2]) if kind == "done" else Outcome(w.task, error=msg[2]))
            w.task, w.payload, w.sent = None, None, False
        return True

    def _bury(self, w: _Proc, out: list[Outcome]) -> None:
        w.proc.join(0.5)
        self._procs.remove(w)
        with contextlib.suppress(OSError):
            w.conn.close()
        why = _exit_reason(w.proc.exitcode)
        if not w.ready:
            self._deaths_before_ready += 1
            if not self._any_ready and self._deaths_before_ready >= max(3, self.capacity):
                self.close()
                raise WorkerError(f"search workers die while starting ({why})")
        if w.task is not None:
            out.append(Outcome(w.task, error=f"worker pid {w.proc.pid} {why}", died=True))

    @staticmethod
    def _says_idle(w: _Proc, timeout: float) -> bool:
        """Whether ``w`` answers its stop with ``idle`` within ``timeout`` seconds."""
        try:
            return w.conn.poll(timeout) and w.conn.recv()[0] == "idle"
        except (EOFError, OSError, ValueError):
            return False

    def close(self) -> None:
        """End the search: workers ready and holding no task wait for the process's next
        search (:data:`_IDLE`); every other one is ended at once, whatever it is doing."""
        procs, self._procs = self._procs, []
        asked = []
        for w in procs:
            if w.ready and w.task is None and w.proc.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    w.conn.send(("stop", IDLE_EXIT_S))
                    asked.append(w)
        # kept: those that answer at once (a stopped or stuck process does not)
        end = time.monotonic() + IDLE_ACK_S
        kept = [w for w in asked if self._says_idle(w, max(0.0, end - time.monotonic()))]
        with _IDLE_LOCK:
            _IDLE.extend((w, time.monotonic()) for w in kept)
        procs = [w for w in procs if w not in kept]
        for w in procs:
            if w.proc.is_alive():
                w.proc.terminate()
        end = time.monotonic() + 2.0
        for w in procs:
            w.proc.join(max(0.0, end - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(1.0)
            with contextlib.suppress(OSError):
                w.conn.close()


def _exit_reason(code: Optional[int]) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


# ---------------------------------------------------------------------- ray

class _RayWorker:
    """A Ray actor holding one worker's state (made a Ray actor class on first use)."""

    def __init__(self, shared: dict[str, Any]) -> None:
        share_cores(SearchConfig.from_json(shared["config"]).workers)
        self.state = WorkerState(shared)

    def handle(self, payload: dict) -> dict:
        return self.state.handle(payload)


class RayExecutor:
    """One Ray actor per worker (see the module docstring)."""

    name = "ray"

    def __init__(self, workers: int, address: Optional[str] = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("executor='ray' needs Ray: pip install 'mugraph[ray]'") from None
        self._ray = ray
        self.capacity = max(1, workers)
        self._address = address
        self._idle: list[Any] = []
        self._running: dict[Any, tuple[Any, int]] = {}
        self._actors: list[Any] = []
        self._shared_ref = None
        self._cls = None
        self._deaths = 0
        self._any_ok = False

    def start(self, shared: dict[str, Any]) -> None:
        ray = self._ray
        if not ray.is_initialized():
            try:
                ray.init(address=self._address, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR")
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"ray_address={self._address!r}: cannot connect to a Ray cluster "
                                  f"({one_line(e)})") from None
        # one CPU per actor: more actors than the cluster has CPUs would never be scheduled, and
        # the tasks handed to them would wait for ever (without a time limit)
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus >= 1:
            self.capacity = min(self.capacity, cpus)
        self._shared_ref = ray.put(shared)
        self._cls = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_RayWorker)

    def idle(self) -> int:
        return self.capacity - len(self._running)

    def busy(self) -> list[int]:
        return [i for _, i in self._running.values()]

    def submit(self, index: int, payload: dict) -> None:
        actor = self._idle.pop() if self._idle else self._new_actor()
        ref = actor.handle.remote(payload)
        self._running[ref] = (actor, index)

    def _new_actor(self):
        assert self._cls is not None
        a = self._cls.remote(self._shared_ref)
        self._actors.append(a)
        return a

    def wait(self, timeout: float) -> list[Outcome]:
        ray = self._ray
        if not self._running:
            time.sleep(max(0.0, min(timeout, 0.05)))
            return []
        refs = list(self._running)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        out: list[Outcome] = []
        for ref in ready:
            actor, index = self._running.pop(ref)
            try:
                out.append(Outcome(index, ray.get(ref)))
                self._any_ok = True
                self._idle.append(actor)
            except ray.exceptions.RayActorError as e:
                self._forget(actor)
                self._deaths += 1
                if not self._any_ok and self._deaths >= max(3, self.capacity):
                    self.close()
                    raise WorkerError(f"Ray search workers die while starting ({_ray_reason(e)})") from None
                out.append(Outcome(index, error=f"Ray actor lost: {_ray_reason(e)}", died=True))
            except ray.exceptions.RayTaskError as e:
                self._idle.append(actor)
                cause = getattr(e, "cause", None)
                out.append(Outcome(index, error=one_line(cause) if isinstance(cause, BaseException) else one_line(e)))
        return out

    def _forget(self, actor) -> None:
        with contextlib.suppress(ValueError):
            self._actors.remove(actor)
        with contextlib.suppress(Exception):
            self._ray.kill(actor, no_restart=True)

    def close(self) -> None:
        for a in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(a, no_restart=True)
        self._actors, self._idle, self._running = [], [], {}


def _ray_reason(e: BaseException) -> str:
    lines = [s for s in str(e).splitlines() if s.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]
