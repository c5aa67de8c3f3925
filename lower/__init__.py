"""lower — turn μGraphs into Triton kernels (DESIGN §6, paper §6).

Passes, each in its own module: tile-dim analysis and padding (:mod:`lower.tiles`),
layout ILP (:mod:`lower.layout`), scheduling (:mod:`lower.schedule`), memory
planning (:mod:`lower.memory`), Triton code generation (:mod:`lower.codegen`),
the runtime (:mod:`lower.runtime`), the analytic cost model
(:mod:`lower.cost_model`) and GPU profiling / autotuning (:mod:`lower.profile`).

    import lower
    prog = lower.compile(graph, device="cuda")      # or "cpu": Triton interpreter
    y = prog(x, w)                                  # torch tensors in, out
    print(prog.triton_source()); prog.predicted_time()
    best = lower.profile(graph)                     # GPU: autotuned, timed

``lower`` imports ``mugraph`` only.
"""

from .config import KernelConfig
from .runtime import CompiledProgram, compile  # noqa: A004 - the public name
from . import cost_model
from .profile import profile, tune

__all__ = ["compile", "CompiledProgram", "KernelConfig", "cost_model", "profile", "tune"]
