"""mugraph.core.unionfind: the one disjoint-set structure of the IR and the stages."""

import random

from mugraph.core.unionfind import UnionFind


def test_sets_roots_and_groups():
    uf = UnionFind([5, 3, 9, 1])
    assert uf.union(9, 3) == 3 and uf.find(9) == 3
    assert uf.union(5, 9) == 3  # the smaller root wins, whatever the argument order
    assert uf.find(1) == 1 and 1 in uf and 7 not in uf
    assert uf.groups() == {3: [5, 3, 9], 1: [1]}  # keys in the order they were added
    assert list(uf) == [5, 3, 9, 1] and len(uf) == 4
    assert uf.find(7) == 7 and 7 in uf  # find adds a new key as its own set


def test_roots_do_not_depend_on_union_order():
    """Anything keyed by roots (index classes, dim classes) must not change when the
    same ties are made in another order."""
    rng = random.Random(0)
    pairs = [(rng.randrange(40), rng.randrange(40)) for _ in range(30)]
    ref = UnionFind(range(40))
    for a, b in pairs:
        ref.union(a, b)
    for _ in range(5):
        rng.shuffle(pairs)
        uf = UnionFind(range(40))
        for a, b in pairs:
            uf.union(*((b, a) if rng.random() < 0.5 else (a, b)))
        assert uf.groups() == ref.groups()
        assert all(uf.find(k) == min(g) for g in uf.groups().values() for k in g)


def test_tuple_keys():
    uf = UnionFind()
    uf.union((2, 0), (1, 1))
    uf.union((1, 1), (0, 3))
    assert {uf.find(k) for k in [(2, 0), (1, 1), (0, 3)]} == {(0, 3)}
