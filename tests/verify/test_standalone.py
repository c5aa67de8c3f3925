"""Standalone verification of files: verify.verify_files, python -m verify, layering."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import mugraph as mg
import verify
from mugraph.core.benchmarks import program, reference
from verify.standalone import main

ROOT = Path(__file__).resolve().parents[2]

PAIR = '''
import mugraph as mg
from mugraph.core.benchmarks import program, reference

REF = program("lora", small=True)

def CAND():
    return reference("lora", small=True)
'''

BROKEN = '''
import mugraph as mg
from mugraph.core.benchmarks import program

def REF():
    return program("lora", small=True)

p = mg.Program("lora")
X = p.input("X", (16, 64)); W = p.input("W", (64, 256)); A = p.input("A", (64, 16)); B = p.input("B", (16, 256))
p.output(X @ W - (X @ A) @ B)
CAND = p
'''


def test_json_files(tmp_path):
    mg.save(program("gqa", small=True), tmp_path / "ref.json")
    mg.save(reference("gqa", small=True), tmp_path / "cand.json")
    v = verify.verify_files(tmp_path / "ref.json", tmp_path / "cand.json", seed=0)
    assert v.equivalent and v.ok


def test_py_file_with_ref_and_cand(tmp_path):
    f = tmp_path / "pair.py"
    f.write_text(PAIR)
    assert verify.verify_files(f, seed=0).equivalent
    assert verify.verify_files(str(f), str(f), seed=0, float_check=False).equivalent


def test_py_broken_candidate(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text(BROKEN)
    v = verify.verify_files(f, seed=0)
    assert v.equivalent is False and v.counterexample is not None


def test_mixed_json_and_single_graph_py(tmp_path):
    mg.save(program("lora", small=True), tmp_path / "ref.json")
    f = tmp_path / "one.py"
    f.write_text("from mugraph.core.benchmarks import reference\nkernel = reference('lora', small=True)\n")
    assert verify.verify_files(tmp_path / "ref.json", f, seed=0, float_check=False).equivalent


def test_bad_files_one_line_errors(tmp_path):
    f = tmp_path / "none.py"
    f.write_text("x = 1\n")
    with pytest.raises(mg.MugraphError, match="define REF"):
        verify.verify_files(tmp_path / "none.py")
    with pytest.raises(mg.MugraphError, match="no such file"):
        verify.verify_files(tmp_path / "missing.json", tmp_path / "missing.json")
    g = tmp_path / "boom.py"
    g.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(mg.MugraphError, match="boom"):
        verify.verify_files(g)


def test_main_exit_codes(tmp_path, capsys):
    f = tmp_path / "pair.py"
    f.write_text(PAIR)
    assert main([str(f), "--seed", "0", "--no-float"]) == 0
    assert "EQUIVALENT" in capsys.readouterr().out
    b = tmp_path / "broken.py"
    b.write_text(BROKEN)
    assert main([str(b), "--seed", "0", "--json"]) == 1
    assert '"equivalent": false' in capsys.readouterr().out
    assert main([str(tmp_path / "nope.json")]) == 2


def test_mugraph_cli_verify(tmp_path):
    mg.save(program("lora", small=True), tmp_path / "ref.json")
    mg.save(reference("lora", small=True), tmp_path / "cand.json")
    r = subprocess.run([sys.executable, "-m", "mugraph", "verify", str(tmp_path / "ref.json"),
                        str(tmp_path / "cand.json"), "--seed", "1"], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "EQUIVALENT" in r.stdout


def test_layering_verify_imports_mugraph_only():
    for f in (ROOT / "verify").glob("*.py"):
        src = f.read_text()
        assert not re.search(r"^\s*(from|import)\s+(search|lower)\b", src, re.M), f
