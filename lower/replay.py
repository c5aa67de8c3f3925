"""The tuner's order replayed against recorded times, without a GPU.

A tuning on the GPU (:func:`lower.profile.tune`) times configurations in an order it learns
as it goes — the cost model's ranking, corrected by what it has measured
(:mod:`lower.tuning_order`) — and in a decode step's pieces its share of the budget often ends
after a handful: Phi-3-mini's down projection shipped at 17.4 μs where its μGraph runs 15.0 at
split-K 4, a configuration the order reached fifth (docs/results.md, "Chunks, sub-tiles and
rounds"). How many timings the order needs to reach a kernel's fastest configuration can be
measured without a GPU, against a sweep that timed its configurations
(``lower/data/h200_sweeps.jsonl.gz``): :func:`replay` runs the tuner's own first round,
layout climb and sweeps with the recorded times standing in for the GPU's.

A configuration the sweep did not time counts as a timing spent that found nothing, as one
that fails to compile would: the replay's count is an upper bound where the sweep is sparse
(it times neither the second combine mode nor warps other than its own). The small-matmul
lowerings are those :data:`lower.profile.SMALL_MM_MENU` offers, whatever the inputs' layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mugraph.core.errors import ResourceError
from mugraph.core.ir import KernelGraph

from .config import KernelConfig
from .cost_model import DeviceParams
# the tuner's own parts, run as tune() runs them for one kernel (tune() itself needs a GPU)
from .profile import DEFAULT_WAITING, SMALL_MM_MENU, STAGES, WARPS, _KernelTuning, _space, _TuneCall

#: timings a replay runs at most (the tuner's order beyond them is not followed)
MOST = 24


@dataclass
class Replay:
    """What the tuner timed, in its order, against the recorded times of one kernel."""

    timed: list[tuple[str, float | None]]   # (config label, recorded seconds; None: not recorded)
    fastest: float                          # s: the fastest recorded configuration

    def best_after(self, n: int) -> float:
        """The fastest of the first ``n`` timings over the fastest recorded (inf: none recorded)."""
        got = [t for _, t in self.timed[:n] if t is not None]
        return min(got) / self.fastest if got else math.inf

    def reached(self, within: float = 1.03) -> int | None:
        """Timings until one ran within ``within`` × the fastest recorded (None: not in the replay)."""
        return next((i + 1 for i in range(len(self.timed)) if self.best_after(i + 1) <= within), None)


def replay(graph: KernelGraph, seconds: dict[str, float], device_params: DeviceParams, most: int = MOST) -> Replay:
    """The tuner on ``graph``'s one graph-defined kernel, each configuration's time taken from
    ``seconds`` (config label → recorded seconds), for its first ``most`` timings; priced as
    ``device_params`` (already :func:`lower.cost_model.for_timing` as the sweep timed)."""
    kernels = [o for o in graph.ops if o.kind == "graph_defined"]
    if len(kernels) != 1 or not seconds:
        raise ValueError(f"lower.replay: {graph.name} has {len(kernels)} graph-defined kernels and {len(seconds)} "
                         "recorded times; a replay needs one kernel and at least one time")
    (op,) = kernels
    timed: list[tuple[str, float | None]] = []

    def timer(configs: dict[int, KernelConfig]) -> float | None:
        if len(timed) >= most:
            return None  # past the replay's end: the tuner's later steps find nothing
        label = configs[op.id].label()
        timed.append((label, seconds.get(label)))
        return seconds.get(label)

    call = _TuneCall(graph, [op], None, None, 0.0, "replay", None, None, device_params, WARPS, STAGES,
                     configs={op.id: DEFAULT_WAITING}, timer=timer)
    space = _space(graph, op, call.configs, 6, WARPS, STAGES, SMALL_MM_MENU, device_params)
    try:
        _KernelTuning(call, op, None).choose(space)
    except ResourceError:
        pass  # nothing the replay timed was recorded
    return Replay(timed, min(seconds.values()))
