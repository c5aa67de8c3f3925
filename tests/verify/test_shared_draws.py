"""verify.shared_draws: the fingerprint's fixed draws and the program's outputs on them,
computed once and mapped by every process of a search — the same values as without
sharing, and a worker that finds them never computes them again."""

import os

import numpy as np
import pytest
import torch

import verify
import verify.equivalence as eq
from mugraph.core.benchmarks import program, reference
from verify import shared_draws


@pytest.fixture
def shared_dir():
    with shared_draws.temporary() as d:
        yield d
    assert not d.exists()  # removed when the block ends


def test_without_a_directory_values_are_made_every_time():
    calls = []
    assert shared_draws.directory() is None
    for _ in range(2):
        shared_draws.load_or_make("k", lambda: calls.append(1) or [np.arange(3)])
    assert len(calls) == 2


def test_a_shared_value_is_made_once_then_mapped_copy_on_write(shared_dir):
    calls = []

    def make():
        calls.append(1)
        return [np.arange(12, dtype=np.int64).reshape(3, 4), np.ones(5)]

    key = shared_draws.key("draw", 0, 7, 3, "X", (3, 4))
    first = shared_draws.load_or_make(key, make)
    again = shared_draws.load_or_make(key, make)
    assert len(calls) == 1
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert isinstance(again[0], np.memmap)
    again[0][0, 0] = 99  # a private page: the file and the next reader keep the value
    assert shared_draws.load_or_make(key, make)[0][0, 0] == 0
    assert len(calls) == 1


def test_temporary_restores_the_setting_before_it():
    with shared_draws.temporary() as outer:
        with shared_draws.temporary() as inner:
            assert shared_draws.directory() == inner != outer
        assert shared_draws.directory() == outer
    assert shared_draws.directory() is None


def test_a_vanished_directory_still_gives_the_values():
    with shared_draws.temporary() as d:
        os.rmdir(d)
        (a,) = shared_draws.load_or_make("k", lambda: [np.arange(4)])
        assert list(a) == [0, 1, 2, 3]


def test_fingerprints_do_not_change_with_sharing():
    p, g = program("gated_mlp", small=True), reference("gated_mlp", small=True)
    want = verify.fingerprint(g, seed=5)
    eq._fixed_draw_at.cache_clear()
    with shared_draws.temporary():
        assert verify.fingerprint(g, seed=5) == want
        eq._fixed_draw_at.cache_clear()
        assert verify.fingerprint(g, seed=5) == want  # now read from the files
        assert verify.Fingerprinter(p, seed=5).matches(g)
    eq._fixed_draw_at.cache_clear()


def test_a_second_process_reads_the_program_outputs_instead_of_computing_them(monkeypatch):
    p = program("rmsnorm_matmul", small=True)
    with shared_draws.temporary():
        want = verify.Fingerprinter(p, seed=2).target()
        eq._fixed_draw_at.cache_clear()  # as in a fresh worker process

        def refuse(*a, **k):
            raise AssertionError("evaluated the program again")

        monkeypatch.setattr(eq, "_fixed_outputs", refuse)
        monkeypatch.setattr(eq, "uniform_residues", refuse)
        got = verify.Fingerprinter(p, seed=2).target()
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        # and the candidate side draws nothing either: the inputs are in the directory too
        assert eq._fixed_draw(2, eq.fingerprint_field(2, verify.DEFAULT), "X", tuple(p.inputs[0].shape)) is not None
    eq._fixed_draw_at.cache_clear()


def test_fixed_draws_are_exact_float64_residues():
    """Stored as float64 like a test's draws (a weight enters the GEMM without a copy);
    the same residues as the int64 draw of the same generator."""
    from verify.field import uniform_residues

    fld = eq.fingerprint_field(0, verify.DEFAULT)
    d = eq._fixed_draw(0, fld, "W", (64, 32))
    assert d.xp.dtype == torch.float64 and d.xq.dtype == torch.float64
    rng = np.random.default_rng([0, eq.zlib.crc32(b"W"), 64, 32])
    want = uniform_residues(rng, fld.p, (64, 32))
    assert np.array_equal(d.xp.numpy().astype(np.int64), want)


def test_a_draw_cached_before_a_search_is_still_written_for_its_workers():
    """A second search in one process (bench rows, a second superoptimize) must not hand its
    workers an empty directory because the draws were cached by the first."""
    fld = eq.fingerprint_field(0, verify.DEFAULT)
    before = eq._fixed_draw(0, fld, "W", (32, 16))
    with shared_draws.temporary() as d:
        shared = eq._fixed_draw(0, fld, "W", (32, 16))
        assert any(p.suffix == ".count" for p in d.iterdir())
        assert torch.equal(before.xp, shared.xp)
    # the directory is gone and nothing maps its files any more
    assert eq._fixed_draw_at.cache_info().currsize == 0
