"""``OptimizeConfig.input_strides``: a program whose inputs arrive as strided views (a weight
handed in transposed, as ``nn.Linear`` stores it) is tuned and compiled for that layout —
checked, part of the cache key, kept by the answer, read in place by its kernels."""

import pytest
import torch

import mugraph as mg
from lower.profile import strides_of
from mugraph.core.errors import ConfigError
from mugraph.pipeline.cache import cache_key
from mugraph.pipeline.optimize import make_config


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _projection(k: int = 64, n: int = 32) -> mg.Program:
    p = mg.Program("proj")
    x, w = p.input("X", (2, k), "float32"), p.input("W", (k, n), "float32")
    p.output(mg.silu(x @ w))
    return p


def test_the_layout_is_part_of_the_question():
    p = _projection()
    plain = make_config({})
    strided = make_config({"input_strides": {"W": (1, 64)}})
    assert strided.input_strides == {"W": (1, 64)}
    assert make_config({"input_strides": {}}).input_strides is None  # empty: every input row-major
    assert cache_key(p, plain, 0, "cpu") != cache_key(p, strided, 0, "cpu")
    assert strided.to_json()["input_strides"] == {"W": [1, 64]}


@pytest.mark.parametrize("strides, says", [
    ({"V": (1, 64)}, "'V' is not an input of 'proj'"),
    ({"W": (1,)}, "W has 2 dims"),
    ({"W": (1, 32)}, "would overlap"),
    ({"W": (1, -64)}, "tuple of ints >= 0"),
    ({"W": "1,64"}, "tuple of ints >= 0"),
    ([("W", (1, 64))], "must be None or a dict"),
])
def test_a_bad_layout_is_one_line_naming_it(strides, says):
    with pytest.raises(ConfigError, match=says) as e:
        mg.superoptimize(_projection(), {"input_strides": strides}, device="cpu", cache_dir=False, progress=False)
    assert "\n" not in str(e.value)


def test_the_answer_reads_the_transposed_weight_in_place(tmp_path):
    p = _projection()
    cfg = {"search": {"workers": 1, "time_limit": 60, "forloop_ranges": [4], "tile_sizes": [16],
                      "max_kernel_ops": 1, "max_block_ops": 4, "max_results": 1},
           "input_strides": {"W": (1, 64)}}
    opt = mg.superoptimize(p, cfg, device="cpu", cache_dir=tmp_path, progress=False)
    assert opt.input_strides == {"W": (1, 64)}
    prog = opt.compiled("cpu")
    assert prog.input_strides[1] == (1, 64)
    g = torch.Generator().manual_seed(0)
    x, wt = torch.randn(2, 64, generator=g), torch.randn(32, 64, generator=g)  # wt: nn.Linear's (out, in)
    torch.testing.assert_close(opt(x, wt.t()), torch.nn.functional.silu(x @ wt.t()), rtol=1e-4, atol=1e-4)
    # the layout survives the cache and a saved file
    again = mg.superoptimize(p, cfg, device="cpu", cache_dir=tmp_path, progress=False)
    assert again.input_strides == {"W": (1, 64)}
    back = mg.load(opt.save(tmp_path / "opt.json"))
    assert back.input_strides == {"W": (1, 64)}


def test_the_tuner_times_the_layout_it_is_handed():
    w = torch.zeros(32, 64).t()
    assert strides_of({"X": torch.zeros(2, 64), "W": w}) == {"W": (1, 64)}
    assert strides_of({"X": torch.zeros(2, 64)}) == {}
