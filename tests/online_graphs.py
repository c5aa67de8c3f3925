"""The whole-row safe softmax and its online μGraph written by hand (docs/design.md §3.4),
shared by the verifier's and the search's tests of the online form; an attention-shaped
online μGraph, with or without an additive mask, shared by the lowering's tests."""

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
    m = mg.max(s, 1)
    e = mg.exp(s - m)
    bg.output(bg.accum(e @ vv, m) / bg.accum(mg.sum(e, 1), m), (0, None, None))
    (o,) = g.kernel(bg)
    g.output(o)
    return g
