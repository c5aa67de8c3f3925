"""The decoder-layer examples' helpers (examples/_layers.py, examples/hf_decoder_layers.py):
each family's tiny layer builds, a decode step reads the KV cache, the floor counts its
bytes, and a row that failed still prints in the table. No compile: the smoke run itself
(``python examples/hf_decoder_layers.py --small --device cpu ...``) takes minutes."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import _layers as L  # noqa: E402
import hf_decoder_layers as H  # noqa: E402


@pytest.mark.parametrize("family", list(L.FAMILIES))
def test_decode_step_reads_the_cache(family):
    cfg, layer, rope = L.build_layer(family, True, "cpu", torch.float32, "sdpa", 64)
    with torch.no_grad():
        for tokens in (1, 3):
            args, how = L.decode_inputs(cfg, rope, tokens, 16, "cpu", torch.float32)
            assert "create_causal_mask" in how, how
            step = L.make_step(layer)
            y = step(*args)
            assert step.last_cache.calls == 1 and y.shape == (1, tokens, cfg.hidden_size)
            # another past gives another output: the new tokens attend over it
            other = (args[0], args[1], args[2], args[3] * 2, args[4] + 1) + args[5:]
            assert not torch.allclose(step(*other), y)
    fb = L.floor_bytes(cfg, layer, 1, 16, torch.float32)
    assert fb["kv"] == 2 * 16 * cfg.num_key_value_heads * L.head_dim(cfg) * 4
    assert fb["total"] > fb["weights"] > 0


def test_a_failed_row_prints():
    header = {"sizes": "tiny", "device": "cpu", "dtype": "float32", "attention": "sdpa", "timing": "wall",
              "kv_cache": "PastKV", "copy_bandwidth_GBps": 10.0, "time_limit_s": 1.0}
    rows = [{"family": "llama", "layer": "LLaMA-3-8B", "tokens": 1, "kv": 64, "error": "build: ImportError: x"},
            {"family": "qwen2", "layer": "Qwen2-7B", "tokens": 1, "kv": 64, "eager_us": 3.0, "compile_us": 2.0,
             "mugraph_us": 1.0, "x_compile": 2.0, "floor_us": 0.5, "x_floor": 2.0}]
    text = H.format_table(rows, header, 2.0)
    assert "build: ImportError: x" in text and "| 2.00× |" in text and "2.000×" in text


def test_runs_split_over_processes_merge_into_one_table(tmp_path, capsys):
    """``--merge``: the rows of several runs' layers.json in one table, ordered by family,
    keys and tokens, each with its run's commit; the geomean over all and the rows below
    1.1× named; a file that is not a layers.json is a one-line error, not a traceback."""
    import json

    def run(commit, *rows):
        f = tmp_path / f"{commit}.json"
        f.write_text(json.dumps({"header": {"commit": commit, "device": "NVIDIA H200"}, "rows": list(rows)}))
        return str(f)

    a = run("abc1234", {"family": "gemma", "layer": "Gemma-2B", "tokens": 1, "kv": 2048, "x_compile": 1.05})
    b = run("def5678-dirty", {"family": "llama", "layer": "LLaMA-3-8B", "tokens": 8, "kv": 2048, "x_compile": 2.0},
            {"family": "llama", "layer": "LLaMA-3-8B", "tokens": 1, "kv": 2048, "x_compile": 1.2})
    assert H.merge([a, b], tmp_path / "out") == 0
    table = (tmp_path / "out" / "table.md").read_text()
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[0:4] for line in body] == [
        ["| LLaMA-3-8B", "1", "2048", "def5678-dirty"], ["| LLaMA-3-8B", "8", "2048", "def5678-dirty"],
        ["| Gemma-2B", "1", "2048", "abc1234"]]
    assert "over 3 rows: 1.361×" in table and "rows below 1.1×: Gemma-2B 1×2048 (1.05×)" in table
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    capsys.readouterr()
    assert H.merge([str(bad)], tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json is not a layers.json" in err


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_a_static_cache_step_matches_the_concatenated_past(family):
    """The static cache (fixed-capacity buffers written in place, an additive mask over the
    slots) gives the step the concatenated past gives, and writing the same rows again
    leaves the buffers as they were."""
    cfg, layer, rope = L.build_layer(family, True, "cpu", torch.float32, "sdpa", 64)
    with torch.no_grad():
        for tokens in (1, 3):
            cat_args, _ = L.decode_inputs(cfg, rope, tokens, 16, "cpu", torch.float32)
            args, how = L.static_inputs(cfg, rope, tokens, 16, "cpu", torch.float32)
            assert args[3].shape[2] == L.static_capacity(16, tokens) == 256 and "256 slots" in how
            step = L.make_static_step(layer)
            y = step(*args)
            k_after = args[3].clone()
            torch.testing.assert_close(y, L.make_step(layer)(*cat_args), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(step(*args), y)
            assert torch.equal(args[3], k_after) and step.last_cache.calls == 1
    mask = L.static_mask(2, 5, 8, "cpu", torch.float32)[0, 0]
    assert (mask == 0).tolist() == [[j <= 5 + t for j in range(8)] for t in range(2)]


@pytest.mark.parametrize("family", list(L.FAMILIES))
def test_a_whole_model_decode_step_is_the_same_step_each_time(family):
    """``hf_model.py``: each family's tiny causal LM builds with its layers, a prompt fills
    transformers' static cache, and a decode step rewound to the prompt's end gives the same
    logits every time (the timed step is one step, replayed) — and other logits than a step
    that sees another prompt. The floor counts an untied embedding's looked-up rows only."""
    import hf_model as M

    cfg, model = M.build_model(family, True, None, "cpu", torch.float32, 64)
    assert cfg.num_hidden_layers == 2 and len(model.model.layers) == 2
    d = M.Decode(model, cfg, 2, 16, 64, "cpu")
    with torch.no_grad():
        a = d.step(model.forward)
        b = d.step(model.forward)
        assert a.shape == (1, 2, cfg.vocab_size) and torch.equal(a, b)
        other = M.Decode(model, cfg, 2, 24, 64, "cpu")
        assert not torch.allclose(other.step(model.forward), a)
    es = 4
    weights = sum(p.numel() for p in model.parameters()) * es
    kv = 2 * cfg.num_hidden_layers * 16 * cfg.num_key_value_heads * L.head_dim(cfg) * es
    emb = model.get_input_embeddings().weight
    tied = emb.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    unread = 0 if tied else (emb.shape[0] - 2) * emb.shape[1] * es
    assert M.floor_bytes(cfg, model, 2, 16, torch.float32) == weights - unread + kv


def test_a_whole_model_row_says_where_its_new_processes_had_no_bytecode():
    """A new process that compiled modules from source (a machine that writes no bytecode)
    times that compile into its first step: the row says so, and says nothing otherwise."""
    import hf_model as M

    row = {"saved_modules_without_bytecode": 569, "mugraph_modules_without_bytecode": 595,
           "inductor_modules_without_bytecode": 0}
    assert "up to 595 modules from source" in M.row_note(row)
    assert M.row_note({"saved_modules_without_bytecode": 0}) == ""


def test_piece_headroom_smoke(tmp_path, capsys):
    """``examples/piece_headroom.py`` on the CPU: a tiny layer's gated projection piece
    superoptimized alone, one row with what shipped and the cost model's price (nothing is
    timed on a CPU), and the JSON with its candidates."""
    import json

    import piece_headroom as P

    out = tmp_path / "rows.json"
    assert P.main(["--family", "llama", "--small", "--device", "cpu", "--kv", "16", "--search", "2",
                   "--workers", "1", "--only", "silu", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "silu" in row["piece"] and row["predicted_us"] > 0 and row["mugraph_us"] is None and row["candidates"]
    assert "| piece | shipped" in capsys.readouterr().out


def test_a_layer_whose_pieces_all_lose_runs_as_traced_where_that_times_faster(tmp_path):
    """A tiny Mistral decode step over a static cache (written in place every call): its pieces
    each lose to their torch ops (a fake timer), and the whole-graph rule times the backend's
    trace, no μGraph, against torch.compile's graph. Told the trace is faster, the graph runs as
    traced: equal to eager's step, twice (the cache is written once a call), and a row's note
    says so."""
    from mugraph.frontend import recent_graphs
    from mugraph.frontend.graph import Captured

    forms = []

    def timer(piece, launches):
        for launch in launches.values():
            launch()
        if isinstance(piece, Captured):
            forms.append(piece.trial)
            return {"mugraph": 1e-6 if piece.trial == [] else 5e-6, "torch": 4e-6}
        return {"mugraph": 2e-6, "torch": 1.5e-6}

    cfg, layer, rope = L.build_layer("mistral", True, "cpu", torch.float32, "sdpa", 64 + 1 + 16)
    ins, _ = L.static_inputs(cfg, rope, 1, 64, "cpu", torch.float32)
    step = L.make_static_step(layer)
    with torch.no_grad():
        want = step(*ins)
        torch._dynamo.reset()
        f = torch.compile(step, backend="mugraph", options={"timer": timer, "time_limit": 2, "inductor": False,
                                                             "cache_dir": str(tmp_path)})
        for _ in range(2):
            torch.testing.assert_close(f(*ins), want, rtol=1e-5, atol=1e-5)
    (cap,) = [c for c in recent_graphs() if c.captured][-1].captured.values()
    assert cap.kept == [] and forms == [[]] and cap.whole["runs"] == "trace"
    assert "the graph runs as traced" in L.row_notes({"graph_runs": cap.whole["runs"]})
