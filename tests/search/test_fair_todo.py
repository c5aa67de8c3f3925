"""The dispatch queue of a search run (``search.dispatch.FairTodo``): no root task's pieces
are buried by another's hand-backs, earlier roots and roots that close candidates get more
of the workers, a root's own pieces stay shallowest first, a retried unit goes first."""

from __future__ import annotations

from collections import Counter

from search.dispatch import FairTodo


class _Run:
    """Units as a search run holds them: ``(root, path)``; root tasks have the empty path."""

    def __init__(self, roots: int) -> None:
        self.units = [(i, ()) for i in range(roots)]
        self.todo = FairTodo(self.units, range(roots))

    def hand_back(self, u: int, n: int) -> list[int]:
        """Unit ``u`` ran past its time: ``n`` pieces below it are queued (as record_unit does)."""
        root, path = self.units[u]
        new = []
        for k in range(n):
            self.units.append((root, path + (k,)))
            new.append(len(self.units) - 1)
        self.todo.extendleft(reversed(new))
        return new


def test_a_root_that_keeps_splitting_does_not_starve_the_next():
    """Root 0 hands back pieces every time it runs (a huge, barren tree): root 1's pieces
    are still served, about half as often as root 0's (its place in the order)."""
    run = _Run(4)
    served = Counter()
    u = run.todo.popleft()
    assert run.units[u] == (0, ())
    run.hand_back(u, 3)
    for _ in range(60):
        u = run.todo.popleft()
        root = run.units[u][0]
        served[root] += 1
        if root in (0, 1):
            run.hand_back(u, 2)  # roots 0 and 1 keep splitting; 2 and 3 finish
    assert served[1] >= 0.35 * served[0] > 0
    assert served[2] == served[3] == 1   # the fresh roots that finish at once are not held back


def test_a_root_that_closes_candidates_is_dug_deeper():
    run = _Run(2)
    a, b = run.todo.popleft(), run.todo.popleft()
    run.hand_back(a, 4)
    run.hand_back(b, 4)
    run.todo.credit(b, 50)   # root 1's first unit closed 50 blocks into candidates
    roots = [run.units[run.todo.popleft()][0] for _ in range(6)]
    assert roots.count(1) > roots.count(0)


def test_a_roots_pieces_stay_shallowest_first_and_a_retry_goes_first():
    run = _Run(1)
    u = run.todo.popleft()
    first = run.hand_back(u, 3)
    assert run.todo.popleft() == first[0]
    run.todo.appendleft(first[0])          # its worker died: it runs again, first
    assert run.todo.popleft() == first[0]
    assert [run.todo.popleft() for _ in range(2)] == first[1:]
    assert not run.todo and len(run.todo) == 0


def test_every_unit_is_served_once():
    run = _Run(5)
    seen = []
    while run.todo:
        u = run.todo.popleft()
        seen.append(u)
        if len(run.units[u][1]) < 2:
            run.hand_back(u, 2)
    assert sorted(seen) == list(range(len(run.units)))
