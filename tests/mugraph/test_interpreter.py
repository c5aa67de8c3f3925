"""The vectorized block-graph interpreter against a naive one that loops over
blocks and iterations and slices tiles by the definitions of docs/design.md §2.3."""

import itertools
import time

import numpy as np
import pytest
import torch

import mugraph as mg
from mugraph.core.algebra import FloatAlgebra
from mugraph.core.benchmarks import PROGRAMS, program, reference


def naive_evaluate(graph: mg.KernelGraph, inputs: dict) -> list[np.ndarray]:
    alg = FloatAlgebra()
    env = {}
    for op in graph.ops:
        if op.kind == "input":
            env[op.outputs[0]] = torch.from_numpy(inputs[op.attrs["name"]])
        elif op.kind == "graph_defined":
            outs = naive_block(op.attrs["block"], [env[t].numpy() for t in op.inputs], alg)
            for t, v in zip(op.outputs, outs):
                env[t] = torch.from_numpy(v)
        else:
            env[op.outputs[0]] = alg.apply(op.kind, [env[t] for t in op.inputs], op.attrs)
    return [env[t].numpy() for t in graph.outputs]


def naive_block(block: mg.BlockGraph, sources, alg) -> list[np.ndarray]:
    F, grid = block.forloop, block.grid
    outs = [np.full(sv.shape, np.nan) for sv in block.savers]
    for b in itertools.product(*(range(g) for g in grid)):
        acc: dict = {}
        env: dict = {}
        for i in range(F):
            env = {}
            for op in block.ops:
                t = op.outputs[0]
                if op.kind == "iterator":
                    src, imap, fmap = sources[op.attrs["source"]], op.attrs["imap"], op.attrs["fmap"]
                    idx = []
                    for d, size in enumerate(src.shape):
                        lo, n = 0, size
                        if d in imap:
                            n //= grid[imap.index(d)]
                            lo += b[imap.index(d)] * n
                        if fmap == d:
                            n //= F
                            lo += i * n
                        idx.append(slice(lo, lo + n))
                    env[t] = torch.from_numpy(np.ascontiguousarray(src[tuple(idx)]))
                elif op.kind == "accum":
                    acc[t] = acc.get(t, 0) + env[op.inputs[0]]
                elif t.acc != 1:
                    env[t] = alg.apply(op.kind, [env[x] for x in op.inputs], op.attrs)
        env.update(acc)
        for op in block.ops:
            t = op.outputs[0]
            if t.acc == 1 and op.kind != "accum":
                env[t] = alg.apply(op.kind, [env[x] for x in op.inputs], op.attrs)
        for sv, out in zip(block.savers, outs):
            tile = sv.tensor.shape
            idx = tuple(slice(b[sv.omap.index(d)] * n, (b[sv.omap.index(d)] + 1) * n) if d in sv.omap
                        else slice(0, n) for d, n in enumerate(tile))
            out[idx] = env[sv.tensor].numpy()
    return outs


def _inputs(g, rng):
    return {t.name: rng.standard_normal(t.shape) for t in g.inputs}


def _graph_both_maps():
    kg = mg.KernelGraph("both_maps")
    X = kg.input("X", (8, 32))
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=4)
    x = bg.input(X, imap=(1,), fmap=1)  # block's half of dim 1, then the loop's quarter of it
    bg.output(bg.accum(x * 2), omap=(1,))
    (y,) = kg.kernel(bg)
    kg.output(y)
    return kg


def _graph_three_axes():
    kg = mg.KernelGraph("three_axes")
    X = kg.input("X", (4, 6, 8))
    bg = mg.BlockGraph(grid=(2, 3, 4), forloop=1)
    x = bg.input(X, imap=(0, 1, 2))
    bg.output(bg.accum(mg.exp(x)), omap=(2, 0, 1))  # blocks write transposed positions
    (y,) = kg.kernel(bg)
    kg.output(y)
    return kg


def _graph_replicated():
    kg = mg.KernelGraph("replicated")
    X = kg.input("X", (4, 8))
    W = kg.input("W", (8, 6))
    bg = mg.BlockGraph(grid=(2, 3, 1), forloop=2)
    x = bg.input(X, fmap=1)  # same tile for every block
    w = bg.input(W, imap=(None, 1), fmap=0)
    bg.output(bg.accum(x @ w), omap=(0, 1))  # grid x replicates: output stacks 2 copies
    (y,) = kg.kernel(bg)
    kg.output(y)
    return kg


def _graph_two_kernels_and_predefined():
    kg = mg.KernelGraph("mixed")
    X = kg.input("X", (4, 16))
    bg = mg.BlockGraph(grid=(4, 1, 1), forloop=4)
    x = bg.input(X, imap=(0,), fmap=1)
    s = bg.accum(mg.sum(mg.square(x), 1))
    bg.output(mg.sqrt(s + 1), omap=(0,))
    (n,) = kg.kernel(bg)
    kg.output(X / n)
    return kg


def _graph_loop_invariant_accum():
    kg = mg.KernelGraph("invariant")
    X = kg.input("X", (4, 8))
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=4)
    x = bg.input(X)  # no fmap: the same tile every iteration, so the sum is 4·X
    bg.output(bg.accum(x))
    (y,) = kg.kernel(bg)
    kg.output(y)
    return kg


def _graph_concat_mixed_batch():
    kg = mg.KernelGraph("concat_mixed")
    X = kg.input("X", (4, 8))
    Y = kg.input("Y", (2, 3))
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=2)
    x = bg.input(X, imap=(0,), fmap=1)  # varies with the block and the iteration
    y = bg.input(Y)  # varies with neither
    bg.output(bg.accum(mg.concat([x, y], 1)), omap=(0,))
    (z,) = kg.kernel(bg)
    kg.output(z)
    return kg


EXTRA = [_graph_loop_invariant_accum, _graph_concat_mixed_batch, _graph_both_maps, _graph_three_axes, _graph_replicated, _graph_two_kernels_and_predefined]


@pytest.mark.parametrize("make", EXTRA, ids=[f.__name__ for f in EXTRA])
def test_vectorized_matches_naive_on_handmade_graphs(make):
    g = make()
    ins = _inputs(g, np.random.default_rng(0))
    for got, want in zip(mg.evaluate(g, ins), naive_evaluate(g, ins)):
        assert not np.isnan(want).any(), "naive evaluator left elements unwritten"
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_replicated_output_is_stacked_copies():
    g = _graph_replicated()
    ins = _inputs(g, np.random.default_rng(1))
    (y,) = mg.evaluate(g, ins)
    ref = ins["X"] @ ins["W"]
    np.testing.assert_allclose(y, np.concatenate([ref, ref]), rtol=1e-12)


def test_loop_invariant_accumulator_counts_every_iteration():
    g = _graph_loop_invariant_accum()
    x = np.random.default_rng(7).standard_normal((4, 8))
    np.testing.assert_allclose(mg.evaluate(g, {"X": x})[0], 4 * x, rtol=1e-12)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_vectorized_matches_naive_on_references(name):
    g = reference(name, small=True)
    ins = _inputs(g, np.random.default_rng(2))
    for got, want in zip(mg.evaluate(g, ins), naive_evaluate(g, ins)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_reference_graphs_agree_with_programs_at_full_shape(name):
    p, g = program(name), reference(name)
    assert [(t.name, t.shape, t.dtype) for t in p.inputs] == [(t.name, t.shape, t.dtype) for t in g.inputs]
    ins = _inputs(p, np.random.default_rng(3))
    (want,) = mg.evaluate(p, ins)
    (got,) = mg.evaluate(g, ins)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-10


@pytest.mark.parametrize("name", ["rmsnorm_matmul", "gated_mlp", "gqa"])
def test_reference_graphs_at_batch_8(name):
    p, g = program(name, b=8, small=True), reference(name, b=8, small=True)
    ins = _inputs(p, np.random.default_rng(4))
    (want,) = mg.evaluate(p, ins)
    (got,) = mg.evaluate(g, ins)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-10


def test_full_grid_and_loop_evaluates_fast():
    """gated_mlp at full size: 64 blocks × 64 iterations, vectorized (not a Python loop).

    The best of three runs: one run alone takes about 0.2 s on 2 cores, but a full xdist
    suite on them once stretched a single run to 3.8 s."""
    g = reference("gated_mlp")
    bg = g.ops_of_kind("graph_defined")[0].attrs["block"]
    assert bg.num_blocks == 64 and bg.forloop == 64
    ins = _inputs(g, np.random.default_rng(5))
    mg.evaluate(g, ins)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        mg.evaluate(g, ins)
        best = min(best, time.perf_counter() - t0)
    assert best < 3.0


def test_input_checks():
    p = program("lora", small=True)
    ins = _inputs(p, np.random.default_rng(6))
    with pytest.raises(mg.InputError, match="missing \\['B'\\]"):
        mg.evaluate(p, {k: v for k, v in ins.items() if k != "B"})
    with pytest.raises(mg.InputError, match="input 'X' has shape \\(16, 3\\), expected \\(16, 64\\)"):
        mg.evaluate(p, {**ins, "X": np.zeros((16, 3))})
    with pytest.raises(mg.InputError, match="unexpected \\['Z'\\]"):
        mg.evaluate(p, {**ins, "Z": np.zeros(3)})


def _chunked_cases():
    """(graph, inputs, max_elements) for every graph above whose kernels run in chunks
    below their whole-grid size: the largest block value halved (never below a kernel
    tensor, which is never chunked)."""
    from mugraph.core.sizing import chunking, largest_value
    graphs = [make() for make in EXTRA] + [reference(name, small=True) for name in PROGRAMS]
    out = []
    for g in graphs:
        kernel_max = max(t.numel for op in g.ops for t in op.outputs)
        limit = max(kernel_max, (largest_value(g)[0] + 1) // 2)
        try:
            if chunking(g, limit):
                out.append((g, limit))
        except mg.ResourceError:  # one block over its loop is already past the halved limit
            pass
    return out


def test_chunked_grid_matches_whole_grid():
    """A kernel too large to evaluate whole runs its grid in chunks of blocks
    (``sizing.block_chunks``): the same values in the same layout (the field
    residues bit for bit: ``tests/verify/test_throughput.py``)."""
    cases = _chunked_cases()
    assert len(cases) >= 4, [g.name for g, _ in cases]
    for g, limit in cases:
        ins = _inputs(g, np.random.default_rng(8))
        for got, want in zip(mg.evaluate(g, ins, max_elements=limit), mg.evaluate(g, ins)):
            # the same float64 ops on other batch shapes: BLAS may sum in another order
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14, err_msg=g.name)


def test_chunked_grid_with_picked_blocks():
    """Picked grid positions (a fingerprint's sample) in chunks: the picked blocks'
    outputs, laid out as ``saved_positions`` says, as without chunks."""
    from mugraph.core.sizing import block_largest, chunking
    tried = 0
    for g, limit in _chunked_cases():
        kernel_max = max(t.numel for op in g.ops for t in op.outputs)
        consumers = g.consumers()
        for op in g.ops_of_kind("graph_defined"):
            if any(consumers.get(t) for t in op.outputs):
                continue  # only a kernel whose outputs nothing reads may be sampled
            picks = {op.id: tuple(tuple(range(0, n, 2)) if n > 2 else tuple(range(n)) for n in op.attrs["block"].grid)}
            n, _ = block_largest(op.attrs["block"], [len(p) for p in picks[op.id]])
            limit = max(kernel_max, (n + 1) // 2)
            if not chunking(g, limit, picks):
                continue
            tried += 1
            ins = _inputs(g, np.random.default_rng(9))
            got = mg.evaluate(g, ins, max_elements=limit, blocks=picks)
            for a, b in zip(got, mg.evaluate(g, ins, blocks=picks)):
                np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14, err_msg=g.name)
    assert tried >= 2


def _sliceable_programs():
    from mugraph.core.benchmarks import decode_attention, prefill_attention
    norm = mg.Program("row_outer_sum")  # a (64, 256) intermediate between small inputs and output
    X, W = norm.input("X", (64, 1)), norm.input("W", (1, 256))
    norm.output(X / mg.sum(mg.square(X * W), 1))
    return [prefill_attention(heads=4, q=64, kv=64, head_dim=16),
            prefill_attention(heads=4, q=64, kv=64, head_dim=16, causal=True),
            decode_attention(heads=32, kv_heads=2, kv=256, head_dim=8, safe=True), norm]


@pytest.mark.parametrize("p", _sliceable_programs(), ids=lambda p: p.name)
def test_sliced_program_matches_whole(p):
    """A program whose intermediates are too large to hold runs in slices of an index no
    op mixes (``sizing.slicing``: an attention's query rows, with its causal mask's
    rows): the same values, in float64 and, exactly, in the field."""
    from mugraph.core.sizing import slicing
    inter = max(t.numel for op in p.ops for t in op.outputs if t not in {*p.inputs, *p.outputs})
    limit = max(max(t.numel for t in [*p.inputs, *p.outputs]), inter // 4)
    sl = slicing(p, limit)
    assert sl is not None and sl.step < sl.size
    ins = _inputs(p, np.random.default_rng(10))
    for got, want in zip(mg.evaluate(p, ins, max_elements=limit), mg.evaluate(p, ins)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


def test_no_unmixed_index_is_refused_with_the_value_named():
    """A program whose every index is mixed somewhere (here: both indices of an outer
    product are summed) has no slices: too large is a one-line error naming the value."""
    from mugraph.core.sizing import parallel_indices
    p = mg.Program("all_mixed")
    X, W = p.input("X", (64, 1)), p.input("W", (1, 64))
    p.output(mg.sum(mg.sum(mg.exp(X * W), 1), 0))
    assert parallel_indices(p) == []
    with pytest.raises(mg.ResourceError, match="t2 \\(64, 64\\) would hold 4096 elements"):
        mg.evaluate(p, {"X": np.ones((64, 1)), "W": np.ones((1, 64))}, max_elements=1024)


class _LiveCounting(FloatAlgebra):
    """Float64, counting how many values the ops made are alive (weakly referenced) at each
    op: the evaluation's memory in values."""

    def __init__(self):
        super().__init__("float64")
        self.made, self.peak = [], 0

    def apply(self, kind, inputs, attrs):
        import gc
        import weakref

        gc.collect()
        self.peak = max(self.peak, sum(r() is not None for r in self.made))
        out = super().apply(kind, inputs, attrs)
        self.made.append(weakref.ref(out))
        return out


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
def test_an_evaluation_holds_only_the_values_still_to_be_read(sliced):
    """Values are dropped after their last reader, and a sliced evaluation keeps only each
    slice's outputs until the slices are joined: at most a few values are alive at once,
    not every intermediate of the program. Why: an 8k-token causal prompt's float check held
    all of its 8.6 GB float64 intermediates, slice after slice, and ran an H200 out of memory."""
    from mugraph.core.benchmarks import prefill_attention

    p = prefill_attention(heads=4, q=64, kv=64, head_dim=16, causal=True)
    ins = _inputs(p, np.random.default_rng(11))
    inter = max(t.numel for op in p.ops for t in op.outputs if t not in {*p.inputs, *p.outputs})
    limit = max(max(t.numel for t in [*p.inputs, *p.outputs]), inter // 4) if sliced else 1 << 30
    alg = _LiveCounting()
    got = mg.evaluate(p, ins, alg, max_elements=limit)
    want = mg.evaluate(p, ins)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-14)
    ops = sum(op.kind != "input" for op in p.ops)
    # whole: the value being made and the one it reads (8 before); sliced: besides those, each
    # slice's output until the join (35 before: every slice's intermediates)
    assert ops >= 8 and alg.peak <= (8 if sliced else 3), (ops, alg.peak)
