"""lower — turn μGraphs into Triton kernels (docs/design.md §7, paper §6).

Lowering is plan → render. Per graph-defined kernel and :class:`KernelConfig`
(:mod:`lower.config`), :func:`lower.plan.plan` makes every decision once — tile-dim
analysis and padding (:mod:`lower.tiles`), scheduling (:mod:`lower.schedule`), loads
and staging, deferred sums, scratch, launch geometry — and Triton code generation
renders the plan (:mod:`lower.codegen`, op emitters in :mod:`lower.emit`). The
analytic cost model (:mod:`lower.cost_model`), the shared-memory estimate and
workspace planning (:mod:`lower.memory`) and GPU profiling / autotuning
(:mod:`lower.profile`) read plans too. Around them: layout ILP (:mod:`lower.layout`)
and the runtime (:mod:`lower.runtime`); :mod:`lower.digests` checks that the
generated Triton stays what it was.

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
