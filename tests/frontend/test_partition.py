"""The partition: every piece is Lax, every non-Lax op lies outside, the pieces are
maximal where the rule allows and never form a cycle."""

import torch
import torch.nn.functional as F

import mugraph as mg
from mugraph.frontend import from_torch

aten = torch.ops.aten
g = torch.Generator().manual_seed(1)


def r(*shape):
    return torch.randn(*shape, generator=g)


def lax_and_outside(cap):
    for bp in cap.pieces:
        mg.check_lax(bp.program)
    inside = {n for bp in cap.pieces for n in bp.piece.nodes}
    for n, i in cap.info.items():
        if not (i.mapped and i.lax):
            assert n not in inside, f"{n.target} ({i.why or 'not Lax'}) inside a piece"
    return inside


def test_rmsnorm_matmul_is_one_piece():
    def fn(x, w, W):
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w) @ W
    cap = from_torch(fn, r(4, 16), r(16), r(16, 16), max_piece_ops=None)  # (the growth alone; no size cut)
    lax_and_outside(cap)
    assert len(cap.pieces) == 1 and not cap.library


def test_gated_mlp_is_one_piece_with_one_exp_per_path():
    def fn(x, w1, w2, w3):
        return (F.silu(x @ w1) * (x @ w2)) @ w3
    cap = from_torch(fn, r(4, 16), r(16, 32), r(16, 32), r(32, 16), max_piece_ops=None, max_piece_matmuls=None)
    lax_and_outside(cap)
    assert len(cap.pieces) == 1
    assert sum(op.kind == "silu" for op in cap.pieces[0].program.ops) == 1


def test_a_gelu_gated_mlp_keeps_its_projections_in_one_piece_at_the_default_limits():
    """GeLU written out is nine element-wise ops of one value; as the size limit counts ops
    they are one (the composition builds such a chain, not searches it), so the gate and up
    projections, the GeLU and their product share a piece and the search can fuse both
    products into one loop. Counted op by op they were 12 ops over the limit of 8: each
    projection landed in a piece of its own (Gemma-2B's MLP)."""
    from mugraph.frontend.partition import _size

    def fn(x, wg, wu, wd):
        return (F.gelu(x @ wg, approximate="tanh") * (x @ wu)) @ wd
    cap = from_torch(fn, r(1, 16), r(16, 64), r(16, 64), r(64, 16))
    lax_and_outside(cap)
    gated = [bp for bp in cap.pieces if sum(op.kind == "matmul" for op in bp.program.ops) == 2]
    assert len(gated) == 1 and sum(op.kind == "exp" for op in gated[0].program.ops) == 1
    assert len([op for op in gated[0].program.ops if op.kind != "input"]) > 8  # over the limit op by op
    assert _size(gated[0].piece.nodes, cap.info) == (4, 2)  # two products, the GeLU, their product
    x = [t.double() for t in (r(1, 16), r(16, 64), r(16, 64), r(64, 16))]
    torch.testing.assert_close(cap.reference()(*x), fn(*x))


def test_two_exps_on_a_path_are_cut():
    def fn(x, w):
        return torch.exp(torch.exp(x @ w) * 0.5) + x
    cap = from_torch(fn, r(4, 8), r(8, 8), min_ops=1)
    lax_and_outside(cap)
    assert len(cap.pieces) == 2
    for bp in cap.pieces:
        assert sum(op.kind == "exp" for op in bp.program.ops) == 1


def test_a_safe_softmax_is_one_piece_with_its_max():
    """The max of a safe softmax is a free shift (design §3.3): it joins the piece with the
    exp, the sum and the division, so an attention is a mugraph piece."""
    def fn(x, w):
        s = x @ w
        return torch.softmax(s, dim=-1) @ w.t()
    cap = from_torch(fn, r(4, 8), r(8, 8))
    lax_and_outside(cap)
    assert not [n for n in cap.library if n.target == aten.amax.default]
    (sm,) = [bp for bp in cap.pieces if any(op.kind == "exp" for op in bp.program.ops)]
    assert {"max", "sub", "exp", "sum", "div"} <= {op.kind for op in sm.program.ops}


def _piece_of(cap, weight):
    """The piece whose program reads ``weight`` (by shape: the tests' weights differ)."""
    (bp,) = [bp for bp in cap.pieces if tuple(weight.shape) in {tuple(t.shape) for t in bp.program.inputs}]
    return bp


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_a_norm_of_a_products_output_goes_to_the_product_that_reads_it():
    """A decoder's residual stream: ``h = x @ Wo + r``, then ``rms(h) @ Wg``. The norm
    reduces ``h``'s columns (384 of them: more than one block holds), which a projection's
    μGraph spreads over its blocks (two more kernels), while the next projection reads the
    whole row and can reduce it in its prologue: the norm joins the consumer's piece, the
    residual stays the producer's epilogue — with no size limit too (the growth alone made
    one piece of all of it)."""
    def fn(x, r_, Wo, w, Wg):
        h = x @ Wo + r_
        return _rms(h, w) @ Wg, h
    args = (r(1, 16), r(1, 384), r(16, 384), r(384), r(384, 40))
    for limits in ({}, {"max_piece_ops": None, "max_piece_matmuls": None}):
        cap = from_torch(fn, *args, **limits)
        lax_and_outside(cap)
        producer, consumer = _piece_of(cap, args[2]), _piece_of(cap, args[4])
        assert producer is not consumer
        assert "sum" not in {op.kind for op in producer.program.ops}
        assert {"add", "matmul"} <= {op.kind for op in producer.program.ops}
        assert {"square", "sum", "sqrt", "matmul"} <= {op.kind for op in consumer.program.ops}
        assert len(producer.program.outputs) == 1  # h only: its square is the consumer's (_sink_into_consumers)
        x = [t.double() for t in args]
        for got, want in zip(cap.reference()(*x), fn(*x)):
            torch.testing.assert_close(got, want)


def test_a_whole_model_is_cut_as_its_layers():
    """Two residual blocks in a row (a model's depth): each norm goes with the projections
    after it, so no piece chains one block's down projection through the next block's norm
    into that block's projection (the growth alone made one piece of both blocks). The
    activation is a square: a SiLU's values summed by ``Wb`` would cut the block there too,
    the verifier being unable to prove such a piece (the test below)."""
    def block(h, w, Wa, Wb):
        return h + torch.square(_rms(h, w) @ Wa) @ Wb

    def fn(h, w1, Wa1, Wb1, w2, Wa2, Wb2):
        return block(block(h, w1, Wa1, Wb1), w2, Wa2, Wb2)
    args = (r(1, 320), r(320), r(320, 32), r(32, 320), r(320), r(320, 48), r(48, 320))
    cap = from_torch(fn, *args, max_piece_ops=None, max_piece_matmuls=None)
    lax_and_outside(cap)
    assert _piece_of(cap, args[3]) is not _piece_of(cap, args[5])   # Wb1 (down) and Wa2 (next up)
    for weight in (args[3], args[5]):  # the first norm with its block's projections, the second with the next
        assert [op.kind for op in _piece_of(cap, weight).program.ops].count("sum") == 1
    torch.testing.assert_close(cap.reference()(*[t.double() for t in args]), fn(*[t.double() for t in args]))


def test_a_reduction_a_block_can_hold_stays_with_its_product():
    """A sum over a product's *rows* (not its columns) is inside each block of a skinny
    projection's grid: it stays in the product's piece. So does a norm of rows short enough
    for one block's tile (``partition.ONE_BLOCK_ROW``), and a softmax's max and sum over a
    score's columns, which the next product walks as its loop (the softmax's core)."""
    from mugraph.frontend.partition import ONE_BLOCK_ROW

    def fn(x, W):
        return (x @ W).sum(0, keepdim=True) * 2.0
    cap = from_torch(fn, r(4, 16), r(16, 512))
    assert len(cap.pieces) == 1 and {"matmul", "sum"} <= {op.kind for op in cap.pieces[0].program.ops}

    def norm_after(x, h, Wo, w, Wg):
        return _rms(x @ Wo + h, w) @ Wg
    n = ONE_BLOCK_ROW
    cap = from_torch(norm_after, r(1, 16), r(1, n), r(16, n), r(n), r(n, 40), max_piece_ops=None)
    assert len(cap.pieces) == 1

    def attn(q, k, v):
        return torch.softmax(q @ k.t(), dim=-1) @ v
    cap = from_torch(attn, r(2, 8), r(1024, 8), r(1024, 8), max_piece_ops=None)
    assert len(cap.pieces) == 1


def test_no_piece_cycle_through_a_library_op():
    # a -> (library) -> b and a -> b: merging a and b around the library op would need
    # the library op both before and after the piece
    def fn(x):
        a = x * 2
        m = torch.cumsum(a, dim=-1)  # no Lax row: a library op
        return a * 3 + m
    cap = from_torch(fn, r(4, 8), min_ops=1)
    lax_and_outside(cap)
    y = cap.reference()(r(4, 8).double())
    assert y.shape == (4, 8)
    order = list(cap.graph_module.graph.nodes)
    for bp in cap.pieces:
        for n in bp.inputs:
            assert order.index(n) < order.index(bp.piece.nodes[-1])


def test_lone_elementwise_op_is_left_to_torch():
    cap = from_torch(lambda x: torch.cumsum(x * 2, dim=-1), r(4, 8))
    assert cap.pieces == [] and len(cap.library) == 2
    cap = from_torch(lambda x: torch.cumsum(x * 2, dim=-1), r(4, 8), min_ops=1)
    assert len(cap.pieces) == 1


def test_a_lone_product_is_searched_only_when_skinny():
    """A lone matmul is a piece when it multiplies at most ``SKINNY_ROWS`` rows by an operand
    of at least ``SKINNY_MIN_WEIGHT`` elements (a decode step's projection, where a library
    GEMM leaves bandwidth unused); a small one or one of many rows stays a library call."""
    from mugraph.frontend.partition import SKINNY_MIN_WEIGHT, SKINNY_ROWS

    side = int(SKINNY_MIN_WEIGHT ** 0.5)
    cap = from_torch(lambda x, w: x @ w, r(1, side), r(side, side))
    assert len(cap.pieces) == 1 and [op.kind for op in cap.pieces[0].program.ops if op.kind != "input"] == ["matmul"]
    cap = from_torch(lambda x, w: x @ w, r(SKINNY_ROWS, side), r(side, side))
    assert len(cap.pieces) == 1
    cap = from_torch(lambda x, w: x @ w, r(SKINNY_ROWS + 1, side), r(side, side))  # a prefill's rows
    assert cap.pieces == []
    cap = from_torch(lambda x, w: x @ w, r(1, side // 2), r(side // 2, side))  # half the elements
    assert cap.pieces == []


def test_a_projection_viewed_into_heads_is_cut_from_its_rotation():
    """A biased projection viewed into heads and rotated (Phi-2's and StarCoder2's q and k,
    no norm's piece before them) grows into one piece that holds a reshape of a computed
    value, which the search never generates: such a piece would not be searched at all. The
    view is cut out instead; the projection and its bias are a piece of their own, the
    rotation another (not searched either: its product permutes), the view a torch view
    between them — and the result is unchanged."""
    from mugraph.frontend.run import unsearched
    from mugraph.frontend.options import FrontendOptions

    heads, d = 8, 128

    def fn(x, w, b, cos, sin):
        q = F.linear(x, w, b).view(1, 1, heads, d).transpose(1, 2)
        rot = torch.cat((-q[..., d // 2:], q[..., :d // 2]), dim=-1)
        return q * cos + rot * sin
    args = (r(1, 1, heads * d), r(heads * d, heads * d), r(heads * d), r(1, 1, 1, d), r(1, 1, 1, d))
    cap = from_torch(fn, *args)
    lax_and_outside(cap)
    kinds = [sorted(op.kind for op in bp.program.ops if op.kind != "input") for bp in cap.pieces]
    assert ["add", "matmul"] in kinds, kinds
    # no piece holds the reshape: the projection is searched, the rotation alone is not (its only
    # product multiplies by rotate-half's permutation: run._only_permutes)
    why = {bp.name: unsearched(bp, FrontendOptions()) for bp in cap.pieces}
    assert not any(w and "reshape" in w for w in why.values()), why
    (projection,) = [bp for bp in cap.pieces if sorted(op.kind for op in bp.program.ops if op.kind != "input")
                     == ["add", "matmul"]]
    assert why[projection.name] is None
    assert all("signed permutation" in w for n, w in why.items() if n != projection.name), why
    xs = [x.double() for x in args]
    torch.testing.assert_close(cap.reference()(*xs), fn(*xs))


def test_a_layer_norm_maps_op_by_op():
    """``F.layer_norm`` (ATen's ``native_layer_norm``, one library call before) is traced as
    its statistics and its affine (``aten._native_layer_norm``), so it lands in Lax pieces
    (one in bfloat16, whose float32 core counts as one op; its statistics and its
    normalization in float32, 12 ops over the size limit) and the values are ATen's: in float32, and in bfloat16 with its statistics in
    float32 as ATen's kernel computes them."""
    for dtype in (torch.float32, torch.bfloat16):
        def fn(x, w, b):
            return F.layer_norm(x, (64,), w, b, 1e-5)
        args = (r(2, 3, 64).to(dtype), r(64).to(dtype), r(64).to(dtype))
        cap = from_torch(fn, *args)
        lax_and_outside(cap)
        assert cap.pieces and not [n for n in cap.library if "layer_norm" in str(n.target)]
        kinds = {op.kind for bp in cap.pieces for op in bp.program.ops}
        assert {"sum", "sub", "square", "sqrt", "mul", "add"} <= kinds, kinds
        want = F.layer_norm(args[0].double(), (64,), args[1].double(), args[2].double(), 1e-5)
        torch.testing.assert_close(cap.reference()(*[x.double() for x in args]), want)
        if dtype == torch.bfloat16:  # the traced graph as torch runs it: ATen's own values
            out = cap.graph_module(*args)
            torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, fn(*args), rtol=0, atol=0)


def test_var_mean_is_two_means():
    """``var_mean`` and ``var`` (LayerNorm's statistics) decompose into means of the centred
    square, for any dims, correction and ``keepdim``."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from mugraph.frontend.aten import decompositions

    x = r(3, 5, 7)
    for dim, correction, keep in [([1], 0, False), ([1, 2], 1, True), (None, 1, False), (2, 0, True)]:
        got = make_fx(lambda x: torch.var_mean(x, dim, correction=correction, keepdim=keep),
                      decomposition_table=decompositions())(x)(x)
        for a, b in zip(got, torch.var_mean(x, dim, correction=correction, keepdim=keep)):
            torch.testing.assert_close(a, b)
        one = make_fx(lambda x: torch.var(x, dim, correction=correction, keepdim=keep),
                      decomposition_table=decompositions())
        torch.testing.assert_close(one(x)(x), torch.var(x, dim, correction=correction, keepdim=keep))
        assert "var" not in str(one(x).code).replace("var_", "")  # nothing of var left to run as one call


def test_equal_pieces_share_a_name():
    def fn(x, y):
        return torch.exp(x * 2) + 1, torch.exp(y * 2) + 1
    a = from_torch(fn, r(4, 8), r(4, 8))
    names = [bp.name for bp in a.pieces]
    assert len(names) == 1 or names[0] == names[1]
    b = from_torch(lambda x: torch.exp(x * 2) + 1, r(4, 8))
    assert b.pieces[0].name in names
    c = from_torch(lambda x: torch.exp(x * 2) + 1, r(4, 4))  # another shape: another program
    assert c.pieces[0].name not in names


def _random_program(seed: int, steps: int = 24):
    """A random DAG over (4, 8) values: element-wise Lax ops, exps, matmuls with a weight,
    and library ops (``cumsum``) that a piece must not swallow — paths that leave a piece
    through a library op and come back are what the partition's cycle check is for."""
    rng = torch.Generator().manual_seed(seed)

    def pick(k):
        return int(torch.randint(0, k, (1,), generator=rng))

    kinds = [pick(5) for _ in range(steps)]
    picks = [(pick(10**6), pick(10**6)) for _ in range(steps)]

    def fn(x, w):
        vals = [x]
        for kind, (i, j) in zip(kinds, picks):
            a, b = vals[-1 - i % min(len(vals), 4)], vals[j % len(vals)]
            vals.append([a + b, a * 0.5 - b, torch.exp(a * 0.1), (a @ w) * 0.1, torch.cumsum(a, dim=-1) * 0.1][kind])
        return sum(vals[-4:])
    return fn


def _contracted_is_acyclic(cap) -> bool:
    """Every piece contracted to one node: is the graph still a DAG? (Kahn's algorithm over the whole graph.)"""
    group = {n: ("piece", k) for k, bp in enumerate(cap.pieces) for n in bp.piece.nodes}
    nodes = list(cap.graph_module.graph.nodes)
    succ: dict = {}
    indeg: dict = {group.get(n, n): 0 for n in nodes}
    for n in nodes:
        for u in n.users:
            g, h = group.get(n, n), group.get(u, u)
            if g != h and h not in succ.setdefault(g, set()):
                succ[g].add(h)
                indeg[h] += 1
    ready = [g for g, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        g = ready.pop()
        seen += 1
        for h in succ.get(g, ()):
            indeg[h] -= 1
            if indeg[h] == 0:
                ready.append(h)
    return seen == len(indeg)


def test_random_programs_partition_into_acyclic_lax_pieces():
    """On random programs mixing Lax ops, exps, matmuls and library ops, with piece-size
    cuts on: every piece is Lax with one exponentiation per path, none swallows a library
    op, the contracted graph stays acyclic (the partition's local cycle walks agree with a
    check over the whole graph), and the captured program still computes the function."""
    for seed in range(12):
        fn = _random_program(seed)
        x, w = r(4, 8), r(8, 8)
        cap = from_torch(fn, x, w, min_ops=1, max_piece_ops=4, max_piece_matmuls=1)
        lax_and_outside(cap)
        assert _contracted_is_acyclic(cap), seed
        got = cap.reference()(x.double(), w.double())
        want = fn(x.double(), w.double())
        torch.testing.assert_close(got, want)


def test_an_attention_fills_its_piece_and_the_gated_mlp_after_it_keeps_its_silu():
    """A decoder layer's second half behind its attention: ``o = (sdpa(q, k, v, mask) · rows)
    @ Wo + r``, then an RMSNorm and a SiLU-gated MLP. The attention node holds a whole softmax
    (nine catalog ops: a piece at the default limit) and closes its piece as it grows, so the
    masked rows' factor starts the output projection's piece and the attention's exponential
    does not run on into the MLP's: the gate and up projections keep their SiLU and product
    in one piece, the down projection has its own. Grown through the attention, the MLP's
    SiLU could join no piece with the gate's product (two exponentials on one path): the gate
    and up products went with the norm and the SiLU with the down projection (Phi-3-mini,
    eight new tokens)."""
    def fn(q, k, v, mask, res, Wo, w, Wg, Wu, Wd):
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = res + a.transpose(1, 2).reshape(1, 4, -1) @ Wo
        x = _rms(h, w)
        return h + (F.silu(x @ Wg) * (x @ Wu)) @ Wd
    mask = torch.zeros(1, 1, 4, 32)
    mask[..., 28:] = float("-inf")
    args = (r(1, 4, 4, 16), r(1, 4, 32, 16), r(1, 4, 32, 16), mask, r(1, 4, 64), r(64, 64), r(64),
            r(64, 96), r(64, 96).add(1), r(96, 64))
    cap = from_torch(fn, *args)
    lax_and_outside(cap)
    gated = [bp for bp in cap.pieces if any(op.kind == "silu" for op in bp.program.ops)]
    assert len(gated) == 1 and [op.kind for op in gated[0].program.ops].count("matmul") == 2
    down = _piece_of(cap, args[9])
    assert down is not gated[0] and "silu" not in {op.kind for op in down.program.ops}
    assert "mul" in {op.kind for op in _piece_of(cap, args[5]).program.ops}  # the rows' factor
    x = [t.double() for t in args]
    torch.testing.assert_close(cap.reference()(*x), fn(*x))


def _gelu_mlp(x, w1, b1, w2, b2, res):
    """A GPT-2 / StarCoder2 MLP: a tanh GeLU between two biased projections, the residual."""
    return res + F.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2


def test_an_mlp_summing_gelu_values_is_cut_where_no_proof_could_pass():
    """The second projection of a tanh-GeLU MLP sums values each divided by its own
    ``1 + exp(−u)``: as one piece its program's per-test bound against itself is 1, so no
    μGraph of it could be proven, and it is cut before that projection into two provable
    pieces — unless unproven μGraphs may ship (``proven_only=False``)."""
    from mugraph.frontend.pieces import provable
    from verify.equivalence import per_test_bound

    args = (r(1, 32), r(32, 64), r(64), r(64, 32), r(32), r(1, 32))
    whole = from_torch(_gelu_mlp, *args, max_piece_ops=None, proven_only=False)
    (bp,) = whole.pieces
    assert per_test_bound(bp.program, bp.program)[0] == 1.0
    assert not provable(set(bp.piece.nodes))
    cap = from_torch(_gelu_mlp, *args, max_piece_ops=None)
    lax_and_outside(cap)
    assert _contracted_is_acyclic(cap)
    first, second = _piece_of(cap, args[1]), _piece_of(cap, args[3])
    assert first is not second and len(cap.pieces) == 2
    assert "exp" in {op.kind for op in first.program.ops} and "exp" not in {op.kind for op in second.program.ops}
    assert [op.kind for op in second.program.ops].count("add") == 2  # its bias and the residual
    for part in cap.pieces:
        assert per_test_bound(part.program, part.program)[0] < 1e-3
    x = [t.double() for t in args]
    torch.testing.assert_close(cap.reference()(*x), _gelu_mlp(*x))


def test_a_piece_the_verifier_can_prove_is_not_cut_after_its_exponential():
    """Near misses of the rule above, each kept whole: an attention's ``@ V`` reads its
    divided exponentials, but their divisor is the same along the summed keys (the verifier
    counts it once); a SiLU-gated MLP with its down projection in the piece has a bound
    below 1 as well (its exponents are atoms, design §4.6)."""
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    cap = from_torch(attention, r(2, 4, 8), r(2, 16, 8), r(2, 16, 8), max_piece_ops=None)
    (bp,) = cap.pieces
    assert [op.kind for op in bp.program.ops].count("matmul") == 2

    def gated(x, w1, w2, w3):
        return (F.silu(x @ w1) * (x @ w2)) @ w3
    cap = from_torch(gated, r(4, 16), r(16, 32), r(16, 32), r(32, 16), max_piece_ops=None, max_piece_matmuls=None)
    (bp,) = cap.pieces
    assert [op.kind for op in bp.program.ops].count("matmul") == 3


def test_projections_of_one_activation_share_a_piece_and_a_chain_of_three_does_not():
    """At the default limits an RMSNorm's q, k and v projections are one piece (one pass over
    the activations for the search to find), while a SiLU-gated MLP with its down projection —
    three matmuls, one reading the others' product — is cut into gate·up and down."""
    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g

    def qkv(x, g, wq, wk, wv):
        h = rms(x, g)
        return F.linear(h, wq), F.linear(h, wk), F.linear(h, wv)

    cap = from_torch(qkv, r(1, 16), r(16), r(32, 16), r(8, 16), r(8, 16))
    lax_and_outside(cap)
    assert [[op.kind for op in bp.program.ops].count("matmul") for bp in cap.pieces] == [3]

    def mlp(x, w1, w2, w3, res):
        return (F.silu(x @ w1) * (x @ w2)) @ w3 + res

    cap = from_torch(mlp, r(1, 16), r(16, 32), r(16, 32), r(32, 16), r(1, 16))
    lax_and_outside(cap)
    assert sorted([op.kind for op in bp.program.ops].count("matmul") for bp in cap.pieces) == [1, 2]
    # four projections of one activation: three share a piece, the fourth is cut off (and, a
    # lone product, left to torch)
    def four(x, g, a, b, c, d):
        h = rms(x, g)
        return h @ a, h @ b, h @ c, h @ d

    cap = from_torch(four, r(1, 16), r(16), *(r(16, 8) for _ in range(4)))
    lax_and_outside(cap)
    assert max([op.kind for op in bp.program.ops].count("matmul") for bp in cap.pieces) == 3
