"""A compiled program captured as CUDA graphs runs each new binding of inputs once outside
its capture: Triton specializes kernels on their arguments (pointer alignment, ints equal
to 1), so new inputs can compile a new variant, and loading it inside a capture fails the
capture. The capture is replaced by a recorder here (no GPU); the program runs under the
interpreter."""

import numpy as np
import pytest
import torch

import lower.runtime as runtime
import mugraph as mg


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_every_new_binding_warms_up_outside_the_capture(monkeypatch):
    p = mg.Program("scale_exp")
    x = p.input("X", (4, 8), "float32")
    p.output(mg.exp(mg.scale(x, 0.5)))
    prog = runtime.compile(p, device="cpu")
    calls = []

    def capture(launch, warmups=3):
        calls.append(warmups)
        return launch

    monkeypatch.setattr(runtime, "capture_graph", capture)
    prog.use_cuda_graphs = True  # the GPU path, its capture recorded
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    for v in (a, b, a):
        np.testing.assert_allclose(prog(v).numpy(), torch.exp(v * 0.5).numpy(), rtol=1e-5)
    assert calls == [1, 1]  # two bindings, each warmed up once; the third call replays the first
