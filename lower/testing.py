"""Random valid μGraphs, inputs and a checker, for testing lowering.

The graphs come from the one generator of random μGraphs, :mod:`mugraph.core.randgraph`
(the verifier's fuzz draws from it too), under its lowering profile: every block op
of the catalog, 1–3 grid axes, loops, dims both imapped and fmapped, replicated
inputs, several savers, post-loop ops, broadcasting of tiles, odd sizes (padding +
masks), chains of graph-defined kernels and pre-defined ops between them, with
numerics kept tame so a float64 comparison is meaningful.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from mugraph.core.interpreter import evaluate
from mugraph.core.ir import KernelGraph
from mugraph.core.randgraph import LOWERING, random_ugraph


def random_graph(seed: int, dtype: str = "float32", max_tries: int = 50) -> KernelGraph:
    """A random valid μGraph (deterministic in ``seed``): :func:`mugraph.core.randgraph.random_ugraph`
    under the lowering's profile (:data:`mugraph.core.randgraph.LOWERING`) with ``dtype`` inputs."""
    return random_ugraph(seed, replace(LOWERING, dtype=dtype), max_tries)


def random_inputs(graph: KernelGraph, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Uniform [−1, 1) inputs, but none for a filled input (the program makes it)."""
    g = torch.Generator().manual_seed(seed)
    return {t.name: (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1)
            .to(getattr(torch, t.dtype)).to(device) for t in graph.inputs if t.fill is None}


def bench_inputs(graph: KernelGraph, seed: int = 0, device: str = "cuda") -> dict[str, torch.Tensor]:
    """fp16 inputs uniform in [−0.5, 0.5), drawn on ``device``: what the H100 scripts
    (``examples/bench_kernels.py``, ``examples/sweep_configs.py``) time."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {t.name: ((torch.rand(t.shape, generator=gen, device=device) * 2 - 1) * 0.5).half()
            for t in graph.inputs if t.fill is None}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when ``out`` has a NaN/Inf (e.g. an unwritten element)."""
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(out).all():
        return math.inf
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den > 0 else 1.0)


def check(prog, graph: KernelGraph, inputs: dict[str, torch.Tensor]) -> list[float]:
    """Run ``prog`` into NaN-poisoned outputs and compare with the float64 interpreter."""
    refs = evaluate(graph, {k: v.to("cpu", torch.float64) for k, v in inputs.items()})
    dev = next(iter(inputs.values())).device
    outs = [torch.full(t.shape, float("nan"), dtype=getattr(torch, t.dtype), device=dev) for t in graph.outputs]
    prog(**inputs, out=outs)
    return [rel_error(o, r) for o, r in zip(outs, refs)]



_AOT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from lower.runtime import _load_module
job = json.load(sys.stdin)
result, sys.stdout = sys.stdout, sys.stderr  # whatever the compiler prints stays out of the result
out = []
for source, launches in job["programs"]:
    mod = _load_module(source, interpret=False)
    irs = {}
    for name, (warps, stages, types) in launches.items():
        fn = getattr(mod, name)
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(types))}
        ast = triton.compiler.ASTSource(fn=fn, signature=dict(zip(fn.arg_names, types)), constexprs={},
                                        attrs=aligned)
        try:
            k = triton.compile(ast, target=GPUTarget("cuda", job["arch"], 32),
                               options=dict(num_warps=warps, num_stages=stages))
            irs[name] = k.asm["ttgir"]
        except Exception as e:  # named in the result: one kernel that does not compile is not the rest
            irs[name] = "error: " + (str(e).strip().splitlines() or [type(e).__name__])[0]
    out.append(irs)
json.dump(out, result)
"""

#: storage dtype -> the Triton pointer type of a kernel argument
_POINTER = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}


def _launches(prog) -> dict[str, list]:
    """Kernel name -> [num_warps, num_stages, Triton types of its arguments] of a compiled
    program: each launch passes runtime buffers by name — tensors of the graph (their
    dtype), fp32 workspaces, int32 counters."""
    out = {}
    for step in prog.steps:
        k = step.kernel
        if k is None:
            continue
        dtypes = {t.label(): t.dtype for t in (*step.op.inputs, *step.op.outputs)}
        for ln in k.launches:
            types = ["*i32" if a in k.locks else "*fp32" if a in k.buffers else _POINTER[dtypes[a]]
                     for a in ln.args]
            out[ln.fn] = [ln.num_warps, ln.num_stages, types]
    return out


def gpu_ttgir(programs: list, arch: int = 90) -> list[dict[str, str]]:
    """For each compiled program (``lower.compile``, any device), kernel name -> the Triton GPU
    IR of that kernel, compiled ahead of time for CUDA compute capability ``arch`` — no GPU
    needed: what the tests read to check what Triton makes of a kernel (loads staged by its
    software pipeliner, tensor-core ops). A kernel that does not compile (``ptxas`` runs too)
    maps to ``"error: "`` and the first line of the error. Pointer arguments are taken as
    16-byte aligned, as Triton specializes the tensors torch allocates. Compiled in a fresh
    process without ``TRITON_INTERPRET``: the interpreter's state must not reach the compiler.

    A bfloat16 program compiled for the CPU is refused: its source multiplies in fp32 what
    the GPU's multiplies in bf16 (the interpreter has no bf16 ``tl.dot``), and its IR — fp32
    copies of every staged tile — would not be the GPU's."""
    import json
    import os
    import subprocess
    import sys

    from mugraph.core.errors import InputError

    for p in programs:
        if p.interpret and any(t.dtype == "bfloat16" for t in p.graph.tensors):
            raise InputError(f"gpu_ttgir: {p.graph.name} is a bfloat16 program compiled for the CPU, whose "
                             "kernels emulate bf16 tl.dot in fp32; its IR is not the GPU's")

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    job = json.dumps({"arch": arch, "programs": [[p.triton_source(), _launches(p)] for p in programs]})
    done = subprocess.run([sys.executable, "-c", _AOT], input=job, capture_output=True, text=True, env=env,
                          timeout=600)
    if done.returncode:
        raise RuntimeError(f"ahead-of-time compile failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)
