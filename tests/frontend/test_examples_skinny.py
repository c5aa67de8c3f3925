"""The skinny-projection benchmark's programs (examples/skinny_matmul.py): each family's four
projections at its public sizes, and each program meaning what its torch calls compute. No
search and no GPU: the benchmark itself needs CUDA."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import mugraph as mg  # noqa: E402
import skinny_matmul as S  # noqa: E402


def test_family_projections_take_the_public_sizes():
    found = S.family_projections(["llama", "mistral", "qwen2", "phi3", "gemma"])
    by = {(p.name, fams[0]): p for p, fams in found.items()}
    assert found[by["o+res", "LLaMA-3-8B"]] == ["LLaMA-3-8B", "Mistral-7B"]  # shared shapes run once
    assert len(found) == 16
    assert (by["norm+qkv", "LLaMA-3-8B"].k, by["norm+qkv", "LLaMA-3-8B"].n) == (4096, 6144)
    assert by["norm+qkv", "Qwen2-7B"].epilogue == "bias" and by["norm+qkv", "LLaMA-3-8B"].epilogue == "none"
    assert (by["norm+qkv", "Gemma-2B"].n, by["o+res", "Gemma-2B"].k) == (2560, 2048)  # 8 heads + 2 × 1 KV head of 256
    assert by["gate·up", "Gemma-2B"].gated == "gelu_tanh" and by["gate·up", "Phi-3-mini"].gated == "silu"
    assert (by["down+res", "Qwen2-7B"].k, by["down+res", "Qwen2-7B"].n) == (18944, 3584)


@pytest.mark.parametrize("proj", [
    S.Projection("norm+qkv", 32, 48, norm=True, epilogue="bias"),
    S.Projection("norm+qkv", 32, 48, norm=True),
    S.Projection("o+res", 48, 32, epilogue="residual"),
    S.Projection("gate·up", 32, 40, gated="gelu_tanh"),
], ids=lambda p: f"{p.name}-{p.epilogue}-{p.gated}")
@pytest.mark.parametrize("rows", [1, 8])
def test_program_means_its_torch_calls(proj, rows):
    p = proj.program(rows, "float32")
    rng = np.random.default_rng(0)
    x = {t.name: rng.standard_normal(t.shape) for t in p.inputs}
    got = np.asarray(mg.evaluate(p, x)[0], dtype=np.float64)
    want = proj.torch_ops({k: torch.from_numpy(v) for k, v in x.items()}).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # torch computes the norm in float32
    wide = 2 if proj.gated else 1  # cuBLAS's side runs the gated pair as one product over both weights
    assert proj.cublas({k: torch.from_numpy(v) for k, v in x.items()})().shape == (rows, wide * proj.n)
