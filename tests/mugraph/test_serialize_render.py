"""JSON round trips, the text form, pictures, thread graphs, the CLI."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import mugraph as mg
from mugraph.core.benchmarks import PROGRAMS, program, reference
from mugraph.cli import main as cli
from mugraph.core.serialize import graph_to_json


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("which", ["program", "reference"])
def test_json_round_trip(tmp_path, name, which):
    build = program if which == "program" else reference
    g = build(name)  # full shapes: no arrays are made
    path = mg.save(g, tmp_path / f"{name}.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "mugraph" and doc["version"] == 1
    assert all(isinstance(op["op"], str) for op in doc["ops"])
    back = mg.load(path)
    assert type(back) is type(g)
    assert graph_to_json(back) == doc
    assert str(back) == str(g)
    small = build(name, small=True)
    back_small = mg.load(mg.save(small, tmp_path / "s.json"))
    ins = {t.name: np.random.default_rng(0).standard_normal(t.shape) for t in small.inputs}
    np.testing.assert_array_equal(mg.evaluate(back_small, ins)[0], mg.evaluate(small, ins)[0])


def test_text_form_shows_all_levels():
    text = str(reference("qknorm_gqa", small=True))
    assert text.startswith("KernelGraph qknorm_gqa")
    assert "block grid=(2, 16, 1) forloop=4" in text
    assert "iterator K imap=(0, 2, -) fmap=2" in text
    assert "[thread graph 0]" in text and "# post" in text and "# loop" in text
    assert "save 1: b" in text


def test_thread_graphs_by_rule():
    g = reference("qknorm_gqa", small=True)
    block = g.ops_of_kind("graph_defined")[0].attrs["block"]
    tgs = block.thread_graphs
    assert tgs, "element-wise chains must be fused"
    for tg in tgs:
        assert all(mg.CATALOG[op.kind].elementwise for op in tg.ops)
        assert all(t.op in tg.ops for t in tg.intermediates)
    kinds = [[op.kind for op in tg.ops] for tg in tgs]
    # square feeds a reduction, so it stays alone; each norm's tail and the scaled exp fuse
    assert kinds == [["scale", "sqrt", "div"], ["scale", "sqrt", "div"], ["scale", "exp"]]
    assert [t.label() for t in tgs[2].intermediates] == ["b14"]
    # the saved tile of ntrans is never a register-only intermediate
    nt = reference("ntrans", small=True).ops_of_kind("graph_defined")[0].attrs["block"]
    saved = {sv.tensor for sv in nt.savers}
    assert not saved & nt.register_tensors()


def test_shared_memory_estimate_counts_accumulators_in_fp32():
    kg = mg.KernelGraph("k")
    X = kg.input("X", (16, 64))
    bg = mg.BlockGraph(grid=(1, 1, 1), forloop=4)
    x = bg.input(X, fmap=1)  # 16 x 16 fp16 = 512 B
    bg.output(bg.accum(x))  # 16 x 16 fp32 = 1024 B
    peak, _ = bg.shared_memory_bytes()
    assert peak == 512 + 1024


def test_dot_and_png(tmp_path):
    g = reference("gqa", small=True)
    src = mg.to_dot(g).source
    assert "cluster_k3" in src and "cluster_k4" in src and "iter imap=(0, 2, -) fmap=2" in src
    dot = mg.render(g, tmp_path / "g.dot")
    assert dot.read_text() == src
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' not installed")
    png = mg.render(reference("qknorm_gqa", small=True), tmp_path / "g.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_show_and_demo(tmp_path):
    runner = CliRunner()
    path = mg.save(reference("lora", small=True), tmp_path / "lora.json")
    r = runner.invoke(cli, ["show", str(path), "--png", str(tmp_path / "lora.dot")])
    assert r.exit_code == 0, r.output
    assert "KernelGraph lora" in r.output and (tmp_path / "lora.dot").exists()
    script = tmp_path / "prog.py"
    script.write_text("import mugraph as mg\np = mg.Program('tiny')\nx = p.input('x', (2, 2))\np.output(mg.exp(x))\n")
    r = runner.invoke(cli, ["show", str(script)])
    assert r.exit_code == 0 and "Program tiny" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    r = runner.invoke(cli, ["show", str(bad)])
    assert r.exit_code != 0 and "SerializationError" in r.output and "Traceback" not in r.output
    r = runner.invoke(cli, ["demo", "--small", "--out", str(tmp_path / "demo")])
    assert r.exit_code == 0, r.output
    assert "rmsnorm_matmul" in r.output and (tmp_path / "demo" / "gqa.mugraph.json").exists()
