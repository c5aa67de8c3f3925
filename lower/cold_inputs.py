"""Copies of a program's large inputs, so that a timing reads them from DRAM.

In a model's decode step every weight and every KV cache is read once per step, with the
rest of the step's hundreds of megabytes read in between: each kernel finds them in DRAM,
not in L2. Timed alone, back to back in one CUDA graph, a kernel whose inputs fit in L2
(50–60 MB on an H100/H200) reads them from L2 after the first call, so the tuner ranks
configurations by a speed they do not have in the model (measured on an H200: Phi-3-mini's
output projection, 19 MB of weight, tuned at 7.3 μs, ran 10.1 μs in the layer).

:func:`rotated_sets` makes enough copies of the large inputs that, cycling through them
(:func:`cycling`), at least twice the L2 is read between two uses of one copy. Small inputs
(activations, norms' weights, under :data:`ROTATE_MIN_BYTES`) are shared by every copy: in
the model the kernel before wrote them, so they are in L2 there too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch

from .layout import overlapping

#: inputs at least this large are copied per set (weights, caches); smaller ones are shared
ROTATE_MIN_BYTES = 1 << 20
#: the most sets (copies of the large inputs) one timing cycles through
MAX_SETS = 64
#: the most bytes of copies one timing may allocate (and at most a quarter of free memory)
MAX_COPY_BYTES = 4 << 30
#: the L2 size assumed when the device does not say (an H100's, 50 MB)
DEFAULT_L2_BYTES = 50 * 2**20

Inputs = TypeVar("Inputs", Mapping[str, torch.Tensor], Sequence[torch.Tensor])


def l2_bytes(device: torch.device | None = None) -> int:
    """The L2 cache size of ``device`` (the current CUDA device), or :data:`DEFAULT_L2_BYTES`."""
    try:
        return int(torch.cuda.get_device_properties(device).L2_cache_size) or DEFAULT_L2_BYTES
    except (AttributeError, AssertionError, RuntimeError):
        return DEFAULT_L2_BYTES


def _rotates(t: object) -> bool:
    """Whether ``t`` is copied per set: a tensor of :data:`ROTATE_MIN_BYTES` or more whose
    elements each have their own memory (an expanded view cannot be copied into in place)."""
    return (isinstance(t, torch.Tensor) and t.numel() * t.element_size() >= ROTATE_MIN_BYTES
            and not overlapping(t.shape, t.stride()))


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its strides (a transposed view stays a transposed view: the
    kernels are compiled for the layout)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def set_count(large_bytes: int, l2: int, free_bytes: int | None = None) -> int:
    """How many sets to cycle through when one set's large inputs take ``large_bytes``: the
    fewest with at least ``2 * l2`` bytes of other sets between two uses of one set, within
    :data:`MAX_SETS` and the memory bound (1: no copies)."""
    if large_bytes <= 0:
        return 1
    n = 1 + math.ceil(2 * l2 / large_bytes)
    budget = MAX_COPY_BYTES if free_bytes is None else min(MAX_COPY_BYTES, free_bytes // 4)
    return max(1, min(n, MAX_SETS, 1 + budget // large_bytes))


def rotated_sets(inputs: Inputs, l2: int | None = None) -> list[Inputs]:
    """``inputs`` (a dict of name -> tensor, or a list) first, then copies of it in which every
    large input (:func:`_rotates`) is a fresh copy and the rest are the same objects — as many
    as :func:`set_count` asks for the device's L2 (``l2`` bytes: given, or the device's)."""
    items = list(inputs.items()) if isinstance(inputs, Mapping) else list(enumerate(inputs))
    large = [t for _, t in items if _rotates(t)]
    if not large:
        return [inputs]
    first = large[0]
    if l2 is None:
        l2 = l2_bytes(first.device) if first.is_cuda else DEFAULT_L2_BYTES
    free = torch.cuda.mem_get_info(first.device)[0] if first.is_cuda else None
    n = set_count(sum(t.numel() * t.element_size() for t in large), l2, free)
    copied = {id(t) for t in large}
    sets = [inputs]
    for _ in range(n - 1):
        fresh = [(k, _copy(t) if id(t) in copied else t) for k, t in items]
        sets.append(dict(fresh) if isinstance(inputs, Mapping) else type(inputs)(t for _, t in fresh))
    return sets


def cycling(calls: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """One launch that runs ``calls`` in turn, one per call. Captured into a CUDA graph call by
    call (``triton.testing.do_bench_cudagraph`` unrolls its calls), each captured call reads its
    own set of inputs."""
    if len(calls) == 1:
        return calls[0]
    turn = itertools.cycle(calls)
    return lambda: next(turn)()
