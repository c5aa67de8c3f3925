"""Progress output (:mod:`mugraph.core.progress`): a bar on a terminal; anywhere else plain
lines, one per phase and at most one every 10 s, so a log is not filled with redraws.

The clock is simulated: the tests run a long loop in no time."""

from __future__ import annotations

import io

from mugraph.core.progress import INTERVAL, Progress, is_terminal


class Clock:
    """A simulated ``time.monotonic``: advanced by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Log(io.StringIO):
    """A file-like stream that is not a terminal, noting the clock at each line written."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.times = clock, []

    def write(self, s: str) -> int:
        self.times += [self.clock()] * s.count("\n")
        return super().write(s)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


PHASES = [("oracle", 3.0), ("search", 70.0), ("verify", 22.5)]  # name, simulated seconds


def _simulated_search(stream: io.StringIO, clock: Clock, step: float = 0.5) -> Progress:
    """A 95.5 s search-like loop updating every ``step`` s, as the driver does."""
    p = Progress("search", unit="task", stream=stream, clock=clock, end=clock() + 100.0)
    graphs = verified = 0
    for name, seconds in PHASES:
        p.phase(name, counts={"graphs": graphs, "verified": verified})
        if name == "search":
            p.reset(total=340)
        for _ in range(int(seconds / step)):
            clock.t += step
            if name == "search":
                graphs += 17
            if name == "verify" and verified < 12:
                verified += 1
            p.update(1 if name == "search" and p.n < 340 else 0,
                     counts={"graphs": graphs, "verified": verified})
    p.close()
    return p


def test_not_a_terminal_writes_few_plain_lines():
    clock = Clock()
    log = Log(clock)
    t0 = clock()
    _simulated_search(log, clock)
    out = log.getvalue()
    elapsed = clock() - t0
    assert "\r" not in out and out.endswith("\n")
    lines = out.splitlines()
    # one per phase (the closing line is the end's), plus one per 10 s of simulated time
    assert len(lines) <= len(PHASES) + 1 + elapsed // INTERVAL, lines
    assert len(lines) >= len(PHASES) + 1 + 2  # long phases do report in between
    # the lines within a phase are at least 10 s apart
    starts = {t0 + sum(s for _, s in PHASES[:i]) for i in range(len(PHASES) + 1)}
    periodic = [t for t in log.times if t not in starts]
    assert all(b - a >= INTERVAL for a, b in zip(periodic, periodic[1:])), log.times
    assert lines[0] == "search: oracle, 0 tasks, 0 graphs, 0 verified, 100 s left"
    assert any(line.startswith("search: search, ") and "/340 tasks, " in line for line in lines)
    assert lines[-1] == "search: done, 140/340 tasks, 2,380 graphs, 12 verified, 96 s"


def test_lines_are_rate_limited_whatever_the_update_rate():
    clock = Clock()
    log = Log(clock)
    p = Progress("demo", unit="graph", stream=log, clock=clock)
    for _ in range(10_000):  # 10,000 updates in 25 s
        clock.t += 0.0025
        p.update(1)
    p.close()
    lines = log.getvalue().splitlines()
    assert len(lines) <= 1 + 25 // INTERVAL + 1
    assert lines[-1] == "demo: done, 10,000 graphs, 25 s"


def test_a_terminal_gets_the_bar():
    clock = Clock()
    tty = Tty()
    assert is_terminal(tty)
    p = _simulated_search(tty, clock)
    out = tty.getvalue()
    assert p._bar is not None and "\r" in out
    assert "search (" in out and "s left)" in out and "verify (" in out
    assert "340" in out and "graphs=2380" in out and "verified=12" in out


def test_disabled_writes_nothing():
    for stream in (Log(Clock()), Tty()):
        p = Progress("x", stream=stream, enabled=False)
        p.phase("a")
        p.update(3, counts={"k": 1})
        p.write("a note")
        p.close()
        assert stream.getvalue() == ""


def test_notes_are_single_lines_at_once():
    clock = Clock()
    log = Log(clock)
    p = Progress("search", stream=log, clock=clock)
    p.write("task 3 failed:\nValueError")
    p.write("task 4 failed")
    assert log.getvalue() == "search: task 3 failed: ValueError\nsearch: task 4 failed\n"


def test_a_nested_progress_shares_its_parents_budget():
    """A piece search inside a search: its phases print only when a line is due."""
    clock = Clock()
    log = Log(clock)
    outer = Progress("search", stream=log, clock=clock)
    outer.phase("pieces")
    for piece in range(4):  # four 6 s piece searches of three phases each
        inner = Progress(f"search piece{piece}", stream=log, clock=clock, parent=outer)
        for name in ("oracle", "search", "done-ish"):
            inner.phase(name)
            clock.t += 2.0
            inner.update(1)
        inner.close()
    outer.close()
    assert len(log.times) <= 2 + 24 // INTERVAL
    assert all(b - a >= INTERVAL for a, b in zip(log.times[:-1], log.times[1:-1]))


def test_a_closed_or_odd_stream_is_not_a_terminal():
    s = io.StringIO()
    s.close()
    assert not is_terminal(s) and not is_terminal(object())
