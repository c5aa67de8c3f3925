"""The whole-row safe softmax and its online μGraph written by hand (docs/design.md §3.4),
shared by the verifier's and the search's tests of the online form."""

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
