"""Position-dependent constants (``mugraph.core.fills``): an input with a fill — a causal
attention's additive band — is an input like any other to the search and the proof, and
is made from indices in the kernels instead of read. Checked: the values (causal, offset,
sliding window, grouped-query rows), the IR's text/JSON/fingerprint, the interpreter and
runtime filling what callers leave out, the verifier refusing a candidate whose fill
differs, a proven causal attention μGraph, and the lowered kernels against float64 at
logits ×30 (fp16 and fp32; padded rows, split-K, a permuted read). CPU only (Triton
interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lower
import mugraph as mg
import verify
from lower.config import KernelConfig
from lower.testing import rel_error
from mugraph.core.errors import InputError, InvalidGraphError
from mugraph.core.interpreter import evaluate
from mugraph.core.ir import dataflow_key
from mugraph.core.serialize import graph_from_json, graph_to_json

from online_graphs import attention_ugraph

TOL = {"float32": 1e-5, "float16": 2e-3}
LOW16 = float(np.finfo(np.float16).min)


def _visible(rows: int, keys: int, fill) -> torch.Tensor:
    """The band, written independently of ``fills``: key j visible to row r's query i."""
    i = torch.arange(rows)[:, None] % (fill.period or rows)
    d = torch.arange(keys)[None] - i
    vis = d <= fill.offset
    return vis & (d > fill.offset - fill.window) if fill.window is not None else vis


@pytest.mark.parametrize("fill", [mg.causal_mask(), mg.causal_mask(3), mg.causal_mask(0, window=2),
                                  mg.causal_mask(1, period=2)], ids=str)
def test_band_values(fill):
    v = fill.values((2, 4, 6), "float16")
    vis = _visible(4, 6, fill).numpy()
    assert v.shape == (2, 4, 6) and (v[:, vis] == 0).all() and (v[:, ~vis] == LOW16).all()


def test_bad_fills_are_one_line_errors():
    for make, words in ((lambda: mg.causal_mask(0.5), "offset must be an int"),
                        (lambda: mg.causal_mask(window=0), "window must be a positive int"),
                        (lambda: mg.causal_mask(period=True), "period must be a positive int")):
        with pytest.raises(InvalidGraphError, match=words):
            make()
    p = mg.Program("p")
    with pytest.raises(InvalidGraphError, match="at least 2 dims"):
        p.input("m", (8,), fill=mg.causal_mask())
    with pytest.raises(mg.ArgumentTypeError, match="fill must be a mugraph fill"):
        p.input("m", (8, 8), fill="causal")


def _program(dtype: str = "float32", fill=None) -> mg.Program:
    """Causal attention over one head: S = Q@Kᵀ/√d + M, a safe softmax, times V."""
    p = mg.Program("causal")
    q, kt, v = p.input("q", (48, 16), dtype), p.input("kt", (16, 96), dtype), p.input("v", (96, 16), dtype)
    s = mg.scale(q @ kt, 1 / math.sqrt(16)) + p.input("bias", (48, 96), dtype, fill=fill or mg.causal_mask())
    e = mg.exp(s - mg.max(s, 1))
    p.output((e @ v) / mg.sum(e, 1))
    return p


def _ugraph(dtype: str = "float32", fill=None, steps: int = 3, transposed: bool = False) -> mg.KernelGraph:
    """The online form (``tests/online_graphs.py``): a block per 24 query rows (padded to
    32), the keys walked in ``steps`` (3: 32 keys a step; 4: 24, padded); the band's tile is
    read at the block's rows and the step's keys (``transposed``: stored keys-major, read
    through a permute)."""
    return attention_ugraph(2, 24, 96, 16, steps, dtype, fill or mg.causal_mask(), transposed)


def test_text_json_and_fingerprint_keep_the_fill():
    g = _ugraph(fill=mg.causal_mask(2, window=5, period=24))
    assert "filled band_mask(offset=2, window=5, period=24)" in str(g)
    assert "made: band_mask(offset=2, window=5, period=24)" in mg.to_dot(g).source
    h = graph_from_json(graph_to_json(g))
    assert h.inputs[3].fill == g.inputs[3].fill
    assert dataflow_key(_program()) != dataflow_key(_program(fill=mg.causal_mask(1)))


def _inputs(g, dtype: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Standard normal inputs but the filled one, the queries ×30 (logits an unshifted exp
    overflows on)."""
    gen = torch.Generator().manual_seed(seed)
    return {t.name: (torch.randn(t.shape, generator=gen, dtype=torch.float64) * (30 if t.name == "q" else 1))
            .to(getattr(torch, dtype)) for t in g.inputs if t.fill is None}


def _reference(x: dict[str, torch.Tensor], fill) -> torch.Tensor:
    s = x["q"].double() @ x["kt"].double() / 4
    return torch.softmax(s.masked_fill(~_visible(48, 96, fill), float("-inf")), -1) @ x["v"].double()


def test_the_interpreter_fills_what_the_caller_leaves_out():
    fill = mg.causal_mask(0, window=7)
    p = _program(fill=fill)
    x = _inputs(p, "float32")
    (got,) = evaluate(p, {k: v.double() for k, v in x.items()})
    torch.testing.assert_close(torch.as_tensor(np.asarray(got)), _reference(x, fill), rtol=1e-9, atol=1e-9)


def test_the_verifier_proves_the_online_form_and_refuses_another_fill():
    v = verify.equivalent(_program(), _ugraph(), seed=1)
    assert v.equivalent and v.bound_met, v
    with pytest.raises(InputError, match="'bias' is filled with band_mask\\(offset=0\\) in the reference but "
                                         "band_mask\\(offset=1\\)"):
        verify.equivalent(_program(), _ugraph(fill=mg.causal_mask(1)), seed=1)


def _kernel(g):
    return next(op for op in g.ops if op.kind == "graph_defined")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fill", [mg.causal_mask(), mg.causal_mask(48), mg.causal_mask(0, window=20),
                                  mg.causal_mask(5, period=16)], ids=str)
@pytest.mark.parametrize("label", ["w4s2", "w4s3k2L"])
def test_lowered_band_matches_float64(dtype, fill, label):
    g = _ugraph(dtype, fill, steps=4 if "k2" in label else 3)
    prog = lower.compile(g, device="cpu", configs={_kernel(g).id: KernelConfig.from_label(label)}, poison=True)
    src = prog.triton_source()
    assert "bias_ptr +" not in src and "made from positions" in src  # never read: made from indices
    x = _inputs(g, dtype)
    assert rel_error(prog(**x), _reference(x, fill)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_permuted_band_is_made_in_the_permuted_order(dtype):
    fill = mg.causal_mask(0, window=30)
    g = _ugraph(dtype, mg.causal_mask(0, window=30), transposed=True)
    prog = lower.compile(g, device="cpu", poison=True)
    x = _inputs(g, dtype)
    ref = _reference(x, fill)
    # the stored band is keys-major: its row index is the key, its column the query
    ref_t = torch.softmax((x["q"].double() @ x["kt"].double() / 4).masked_fill(
        ~_visible(96, 48, fill).T, float("-inf")), -1) @ x["v"].double()
    (want,) = evaluate(g, {k: v.double() for k, v in x.items()})
    assert rel_error(prog(**x), torch.as_tensor(np.asarray(want))) <= TOL[dtype]
    assert rel_error(torch.as_tensor(np.asarray(want)), ref_t) < 1e-9 and rel_error(ref_t, ref) > 1e-3


def test_the_runtime_makes_a_fill_a_library_op_reads_and_refuses_one_passed():
    """A pre-defined op reading the filled input gets its values (made once on the device);
    passing the input is refused — the kernels would ignore it."""
    p = mg.KernelGraph("lib")
    s = p.input("s", (4, 6), "float32")
    p.output(mg.add(s, p.input("bias", (4, 6), "float32", fill=mg.causal_mask())))
    prog = lower.compile(p, device="cpu")
    x = torch.randn(4, 6, dtype=torch.float32)
    want = x + torch.from_numpy(mg.causal_mask().values((4, 6), "float32")).float()
    torch.testing.assert_close(prog(x), want)
    with pytest.raises(InputError, match="input 'bias' is made by the program"):
        prog(s=x, bias=torch.zeros(4, 6))
