"""The whole-row safe softmax and its online μGraph written by hand (docs/design.md §3.4),
shared by the verifier's and the search's tests of the online form; attention-shaped
online μGraphs — rows of one head with or without an additive mask, and a decode block per
KV head — shared by the lowering's tests; a grouped-query attention's kernel of one block
per KV head, which the search's split and tile tests rewrite."""

import math

import mugraph as mg

R, N, D, F = 4, 64, 8, 4  # rows, keys, head dim, loop steps


def whole_softmax():
    p = mg.Program("safe")
    s, v = p.input("s", (R, N), "float32"), p.input("v", (N, D), "float32")
    e = mg.exp(s - mg.max(s, 1))
    p.output((e @ v) / mg.sum(e, 1))
    return p


def online_softmax(num="rescaled", den="rescaled", den_shift_dim=1, post_max=False, steps=F):
    """One kernel: the loop walks the keys; per step m = max(s_i), e = exp(s_i − m),
    then Σ e and e @ v are accumulated by ``num``/``den`` (``"rescaled"``: by m;
    ``"sum"``: plainly, the mistake; ``"other"``: rescaled by another tile's max)."""
    g = mg.KernelGraph("online")
    s, v = g.input("s", (R, N), "float32"), g.input("v", (N, D), "float32")
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=steps)
    st, vt = bg.input(s, (None, None, None), 1), bg.input(v, (None, None, None), 0)
    m = mg.max(st, 1)
    other = mg.scale(m, 2)  # a per-row value, but not the one the tile was shifted by
    e = mg.exp(st - m)
    pv, l = e @ vt, mg.sum(e, den_shift_dim)

    def acc(x, how):
        return bg.accum(x) if how == "sum" else bg.accum(x, m if how == "rescaled" else other)

    out = acc(pv, num) / acc(l, den)
    if post_max:  # reading the running max after the loop: the result depends on it
        out = out + bg.accum_max(m)
    bg.output(out, (None, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


def attention_ugraph(blocks: int, rows: int, keys: int, d: int, steps: int, dtype: str, mask=None,
                     transposed: bool = False) -> mg.KernelGraph:
    """Attention: a Q tile (rows × d) per block, Kᵀ and V walked over the keys; S = Q@Kᵀ
    scaled (plus an additive mask ``bias`` filled with ``mask``, read at the block's rows and
    the step's keys; ``transposed``: stored keys-major, read through a permute), m = max(S),
    e = exp(S − m), e@V and Σe accumulated rescaled by m, divided after the loop."""
    g = mg.KernelGraph("attention")
    q = g.input("q", (blocks * rows, d), dtype)
    kt, v = g.input("kt", (d, keys), dtype), g.input("v", (keys, d), dtype)
    bg = mg.BlockGraph(grid=(blocks, 1, 1), forloop=steps)
    qt = bg.input(q, (0, None, None), None)
    kk, vv = bg.input(kt, (None, None, None), 1), bg.input(v, (None, None, None), 0)
    s = mg.scale(qt @ kk, 1 / math.sqrt(d))
    if mask is not None:
        shape = (keys, blocks * rows) if transposed else (blocks * rows, keys)
        bias = g.input("bias", shape, dtype, fill=mask)
        bt = bg.input(bias, (1, None, None), 0) if transposed else bg.input(bias, (0, None, None), 1)
        s = s + (mg.permute(bt, (1, 0)) if transposed else bt)
    return _online_tail(g, bg, s, vv)


def decode_ugraph(heads: int, rows: int, d: int, kv: int, keys: int, k_rows: bool = False) -> mg.KernelGraph:
    """Decode attention online, a block per KV head: its ``rows`` query rows as a
    ``(1, rows, d)`` tile, ``keys`` keys a loop step. ``k_rows``: K stored a key per row, as a
    KV cache holds it, its tile permuted in the block (a permute the lowering folds into the
    load); else stored transposed."""
    g = mg.KernelGraph("decode")
    Q = g.input("Q", (heads, rows, d), "float16")
    K = g.input("K", (heads, kv, d) if k_rows else (heads, d, kv), "float16")
    V = g.input("V", (heads, kv, d), "float16")
    bg = mg.BlockGraph(grid=(heads, 1, 1), forloop=kv // keys)
    qt, vt = bg.input(Q, (0, None, None), None), bg.input(V, (0, None, None), 1)
    kt = mg.permute(bg.input(K, (0, None, None), 1), (0, 2, 1)) if k_rows else bg.input(K, (0, None, None), 2)
    return _online_tail(g, bg, mg.scale(qt @ kt, 1 / math.sqrt(d)), vt)


def _online_tail(g: mg.KernelGraph, bg: mg.BlockGraph, s, v) -> mg.KernelGraph:
    """The online softmax of scores ``s`` (keys in the last dim) weighting ``v``: m = max(s),
    e = exp(s − m), e@v and Σe accumulated rescaled by m, divided after the loop; saved as the
    block's rows of ``g``'s one output."""
    last = s.ndim - 1
    m = mg.max(s, last)
    e = mg.exp(s - m)
    bg.output(bg.accum(e @ v, m) / bg.accum(mg.sum(e, last), m), (0, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g


def gqa_blocks(p: mg.Program, blocks: int, loop: int) -> mg.KernelGraph:
    """``p`` (a grouped-query attention program: Q, Kᵀ, V) as one kernel of ``blocks`` blocks
    along the KV heads, looping ``loop`` times over the keys, without the max (exp, then the
    two sums)."""
    g = mg.KernelGraph("gqa")
    q, k, v = (g.input(t.name, t.shape, t.dtype) for t in p.inputs)
    b = mg.BlockGraph((blocks, 1, 1), loop)
    qt = b.input(q, (0, None, None)); kt = b.input(k, (0, None, None), 2); vt = b.input(v, (0, None, None), 1)
    e = mg.exp(qt @ kt)
    b.output(b.accum(e @ vt) / b.accum(mg.sum(e, 2)), (0, None, None))
    g.output(g.kernel(b)[0])
    return g
