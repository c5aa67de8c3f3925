"""Bad input gets a specific one-line error naming the culprit."""

import json

import pytest

import mugraph as mg
from mugraph.core.benchmarks import reference


def _prog(*shapes, dtype="float16"):
    p = mg.Program("p")
    return p, [p.input(f"x{i}", s, dtype) for i, s in enumerate(shapes)]


def _kg_block(shape=(8, 64), grid=(1, 1, 1), forloop=1):
    kg = mg.KernelGraph("k")
    X = kg.input("X", shape)
    return kg, X, mg.BlockGraph(grid=grid, forloop=forloop)


def matmul_dims():
    p, (a, b) = _prog((2, 4096), (4095, 6144))
    a @ b


def broadcast():
    p, (a, b) = _prog((2, 3), (4, 3))
    a + b


def imap_not_divisible():
    kg, X, bg = _kg_block((8, 60), grid=(8, 1, 1))
    bg.input(X, imap=(1,))


def fmap_not_divisible():
    kg, X, bg = _kg_block((8, 64), forloop=3)
    bg.input(X, fmap=1)


def omap_missing_axis():
    kg, X, bg = _kg_block(grid=(2, 4, 1), forloop=1)
    x = bg.input(X, imap=(0, 1))
    bg.output(bg.accum(x), omap=(0, None))


def no_accumulator():
    kg, X, bg = _kg_block(forloop=1)
    bg.output(mg.exp(bg.input(X)))


def two_accumulators():
    kg, X, bg = _kg_block(forloop=2)
    a = bg.accum(bg.input(X, fmap=1))
    bg.accum(a * 2)


def mixed_phases():
    kg, X, bg = _kg_block(forloop=2)
    x = bg.input(X, fmap=1)
    x + bg.accum(x)


def smem_budget():
    kg = mg.KernelGraph("k")
    W = kg.input("W", (4096, 4096))
    bg = mg.BlockGraph(grid=(2, 1, 1), forloop=1)
    w = bg.input(W, imap=(1,))  # a 4096 x 2048 fp16 tile: 16 MiB
    bg.output(bg.accum(mg.sum(w, 0)), omap=(1,))
    kg.kernel(bg)


def register_budget():
    kg, X, bg = _kg_block((64, 64))
    x = bg.input(X)
    bg.output(bg.accum(mg.sum(mg.exp(mg.exp(x) * 2), 1)))
    kg.kernel(bg, register_budget=1024)


def unknown_dtype():
    _prog((2, 2), dtype="float8")


def five_dims():
    _prog((1, 2, 3, 4, 5))


def output_is_input():
    p, (a,) = _prog((2, 2))
    p.output(a)


def second_exp():
    p, (a,) = _prog((4, 4))
    p.output(mg.exp(mg.sum(mg.exp(a), 1)))
    mg.check_lax(p)


def silu_after_exp():
    p, (a,) = _prog((4, 4))
    p.output(mg.silu(mg.exp(a)))
    mg.check_lax(p)


def second_exp_inside_kernel():
    kg, X, bg = _kg_block(forloop=1)
    bg.output(bg.accum(mg.exp(mg.exp(bg.input(X)))))
    kg.output(kg.kernel(bg)[0])
    mg.check_lax(kg)


def non_lax_op():
    p, (a,) = _prog((4, 4))
    p.output(mg.exp(mg.sum(mg.exp(a), 1)))
    mg.check_lax(p)


def imap_same_dim_twice():
    kg, X, bg = _kg_block(grid=(2, 2, 1))
    bg.input(X, imap=(0, 0))


def imap_on_size1_axis():
    kg, X, bg = _kg_block(grid=(1, 1, 1))
    bg.input(X, imap=(0,))


def fmap_without_loop():
    kg, X, bg = _kg_block(forloop=1)
    bg.input(X, fmap=1)


def omap_same_dim_twice():
    kg, X, bg = _kg_block(grid=(2, 2, 1))
    x = bg.input(X, imap=(0, 1))
    bg.output(bg.accum(x), omap=(1, 1))


def sum_dim_out_of_range():
    p, (a,) = _prog((2, 3))
    mg.sum(a, 2)


def foreign_tensor():
    p1, (a,) = _prog((2, 2))
    p2, (b,) = _prog((2, 2))
    a + b


def dtype_mismatch():
    p = mg.Program("p")
    p.input("a", (2, 2), "float16") + p.input("b", (2, 2), "float32")


def frozen_block():
    kg, X, bg = _kg_block()
    bg.output(bg.accum(bg.input(X)))
    kg.kernel(bg)
    bg.input(X)


def program_kernel():
    p, (a,) = _prog((2, 2))
    p.kernel(mg.BlockGraph())


def reshape_numel():
    p, (a,) = _prog((2, 3))
    mg.reshape(a, (4, 2))


def concat_mismatch():
    p, (a, b) = _prog((2, 3), (3, 3))
    mg.concat([a, b], 1)


def block_without_output():
    kg, X, bg = _kg_block()
    bg.input(X)
    kg.kernel(bg)


def unknown_op():
    p, (a,) = _prog((2, 2))
    p.add_op("softmax", [a])


def duplicate_input():
    p = mg.Program("p")
    p.input("a", (2,))
    p.input("a", (3,))


def bad_grid():
    mg.BlockGraph(grid=(0, 1, 1))


def matmul_rank1():
    p, (a, b) = _prog((4,), (4, 2))
    a @ b


CASES = [
    (matmul_dims, mg.ShapeError, r"matmul \(op #2\): inner dims differ: \(2, 4096\) @ \(4095, 6144\)"),
    (broadcast, mg.ShapeError, r"add .*\(2, 3\) and \(4, 3\) do not broadcast"),
    (imap_not_divisible, mg.InvalidGraphError, r"dim 1 of X \(8, 60\) \(size 60\) is not divisible by grid axis x = 8"),
    (fmap_not_divisible, mg.InvalidGraphError, r"fmap 1: .* not divisible by forloop 3"),
    (omap_missing_axis, mg.InvalidGraphError, r"grid axis y \(size 4\) is missing"),
    (no_accumulator, mg.InvalidGraphError, r"output saver 0: b1 has no accumulator"),
    (two_accumulators, mg.InvalidGraphError, r"accum \(op #3\): b2 is already downstream of an accumulator"),
    (mixed_phases, mg.InvalidGraphError, r"add \(op #2\): mixes loop-body tiles \['b0'\] with post-loop tiles \['b1'\]"),
    (smem_budget, mg.ResourceError, r"16789504 bytes of shared memory \(largest: b0 \(4096, 2048\) float16\) > budget 232448"),
    (register_budget, mg.ResourceError, r"thread graph 0 keeps b1 \(64, 64\) in registers"),
    (unknown_dtype, mg.DTypeError, r"input 'x0': unknown dtype 'float8'"),
    (five_dims, mg.ShapeError, r"input 'x0': shape \(1, 2, 3, 4, 5\) has 5 dims"),
    (output_is_input, mg.InvalidGraphError, r"output: x0 is an input"),
    (second_exp, mg.NotLaxError, r"exp#3: second exponentiation on a path .*: x0 -> exp#1 -> sum#2 -> exp#3"),
    (silu_after_exp, mg.NotLaxError, r"silu#2: second exponentiation"),
    (second_exp_inside_kernel, mg.NotLaxError, r"kernel#1/exp#2: second exponentiation .*X -> kernel#1/exp#1"),
    (non_lax_op, mg.NotLaxError, r"exp#3: second exponentiation on a path"),
    (imap_same_dim_twice, mg.InvalidGraphError, r"grid axes x and y both map to dim 0"),
    (imap_on_size1_axis, mg.InvalidGraphError, r"grid axis x has size 1 and must map to None"),
    (fmap_without_loop, mg.InvalidGraphError, r"forloop is 1, so fmap must be None"),
    (omap_same_dim_twice, mg.InvalidGraphError, r"omap \(1, 1, -?None\)|grid axes x and y both map to dim 1"),
    (sum_dim_out_of_range, mg.ShapeError, r"sum: dim 2 out of range for x0 \(2, 3\)"),
    (foreign_tensor, mg.InvalidGraphError, r"tensor x0 belongs to another graph|belongs to another graph"),
    (dtype_mismatch, mg.DTypeError, r"add \(op #2\): inputs have different dtypes \['float16', 'float32'\]"),
    (frozen_block, mg.InvalidGraphError, r"already attached to a kernel"),
    (program_kernel, mg.InvalidGraphError, r"a Program holds pre-defined ops only"),
    (reshape_numel, mg.ShapeError, r"cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\) \(8\)"),
    (concat_mismatch, mg.ShapeError, r"concat .*differ outside dim 1"),
    (block_without_output, mg.InvalidGraphError, r"block graph has no output saver"),
    (unknown_op, mg.UnsupportedOpError, r"unknown op 'softmax'"),
    (duplicate_input, mg.InvalidGraphError, r"input 'a': an input of that name already exists"),
    (bad_grid, mg.InvalidGraphError, r"grid \(0, 1, 1\)"),
    (matmul_rank1, mg.ShapeError, r"matmul .*rank >= 2"),
]


@pytest.mark.parametrize("fn,err,msg", CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_input_raises_specific_one_line_error(fn, err, msg):
    with pytest.raises(err, match=msg) as info:
        fn()
    assert isinstance(info.value, mg.MugraphError)
    assert "\n" not in str(info.value)


def test_error_hierarchy():
    for e in (mg.ShapeError, mg.NotLaxError, mg.InvalidGraphError, mg.ResourceError, mg.DTypeError,
              mg.SerializationError, mg.InputError, mg.UnsupportedOpError, mg.ConfigError, mg.CacheError,
              mg.ArgumentTypeError, mg.ConstantError):
        assert issubclass(e, mg.MugraphError)
    assert issubclass(mg.ArgumentTypeError, TypeError) and issubclass(mg.ConstantError, ValueError)


def test_corrupt_and_foreign_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(mg.SerializationError, match="not JSON"):
        mg.load(bad)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"hello": 1}))
    with pytest.raises(mg.SerializationError, match="not a mugraph document"):
        mg.load(foreign)
    path = mg.save(reference("lora", small=True), tmp_path / "g.json")
    doc = json.loads(path.read_text())
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(mg.SerializationError, match="unsupported mugraph format version 99"):
        mg.load(path)
    doc["version"] = 1
    doc["ops"][-1]["block"]["savers"][0]["omap"] = [None, None, None]  # blocks would collide
    path.write_text(json.dumps(doc))
    with pytest.raises(mg.SerializationError, match="grid axis x .* is missing"):
        mg.load(path)
    doc = json.loads(mg.save(reference("lora", small=True), tmp_path / "g2.json").read_text())
    doc["ops"][-1]["block"]["ops"][4]["op"] = "frobnicate"
    path.write_text(json.dumps(doc))
    with pytest.raises(mg.SerializationError, match="unknown op 'frobnicate'"):
        mg.load(path)
