"""How many programs of a kernel one SM holds: the shared memory the model charges, against
what Triton compiled (lower.memory.padded_shared_memory, lower.cost_model.residency), and the
compiled kernel's own record (lower.runtime.LaunchResources)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from lower import KernelConfig
from lower.cost_model import H200, estimate, for_timing, residency
from lower.memory import lowered_shared_memory
from lower.runtime import LaunchResources
from lower.runtime import compile as lower_compile
from mugraph.core.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from decode_attention_sweep import decode_attention  # noqa: E402


def _attention(steps: int):
    """Phi-3-mini's decode attention: 32 heads of one query row, 8,448 keys, d 96, a mask."""
    kg = decode_attention(32, 1, 8448, 96, steps, mask=True)
    return kg, next(o for o in kg.ops if o.kind == "graph_defined")


@pytest.mark.parametrize("steps,stages,card", [(32, 2, 22528), (32, 3, 39936), (32, 4, 57344),
                                               (64, 2, 40960), (64, 3, 75776), (64, 4, 110592)])
def test_shared_memory_of_decode_attention_is_what_triton_allocated(steps, stages, card):
    """The pipelining buffers plus the query rows (loaded before the loop) and the
    exponentials (computed from q @ k) on their way to the tensor cores: exactly the
    compiled kernels' shared memory on an H200 (Triton 3.6, every split factor alike)."""
    _, op = _attention(steps)
    for split in (8 if steps == 32 else 4, 12):
        cfg = KernelConfig(num_warps=4, num_stages=stages, split=split, combine="last")
        assert lowered_shared_memory(op.attrs["block"], cfg) == card


def test_model_holds_five_attention_programs_an_sm_and_prices_the_second_wave():
    """Five programs of 39,936 bytes (and the card's 1 KB each beside them) fit one SM's
    227 KB, not six: split-K 22 and 24 (704 and 768 programs on 132 SMs) take a second wave,
    and the model orders split-K 12 first among the 264-step kernel's factors at 3 stages,
    as the card measured (30.6 μs; 22 and 24: 41.8 and 44.2)."""
    kg, op = _attention(32)
    cfg = {k: KernelConfig(num_warps=4, num_stages=3, split=k, combine="last") for k in (4, 8, 11, 12, 22, 24)}
    assert residency(op, cfg[12], H200)["resident"] == 5
    price = {k: estimate(kg, H200, {op.id: c}) for k, c in cfg.items()}
    assert min(price, key=price.get) == 12
    assert price[22] > price[11] and price[24] > price[11]


def test_launch_resources_resident_by_registers_shared_memory_and_warps():
    """Registers go out per warp in 256s; each program reserves 1 KB of shared memory."""
    by_smem = LaunchResources("k", num_warps=4, regs=80, spills=0, shared=39936, programs=384)
    assert by_smem.resident() == 5                      # 228 KB // 40 KB
    by_regs = LaunchResources("k", num_warps=4, regs=150, spills=0, shared=40960, programs=384)
    assert by_regs.resident() == 65536 // (math.ceil(150 * 32 / 256) * 256 * 4) == 3
    by_warps = LaunchResources("k", num_warps=16, regs=32, spills=0, shared=0, programs=1)
    assert by_warps.resident() == 4                     # 64 warps an SM
    too_big = LaunchResources("k", num_warps=4, regs=32, spills=0, shared=300 * 1024, programs=1)
    assert too_big.resident() == 0


def test_resources_need_a_compiled_kernel():
    """In Triton's interpreter nothing is compiled: a one-line error, not a traceback."""
    kg, op = _attention(32)
    prog = lower_compile(kg, device="cpu", configs={op.id: KernelConfig(num_warps=4, num_stages=3)})
    with pytest.raises(InputError, match="interpreter"):
        prog.resources()


def test_a_recorded_launch_reads_what_the_kernel_compiled_to():
    """``CompiledProgram.resources`` wraps each Triton kernel: a launch still runs (its result
    returned) and leaves its compiled kernel's registers, spills, shared memory, warps and
    programs behind, in launch order."""
    from types import SimpleNamespace

    from lower.runtime import _Recording

    ran = []

    class Kernel:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                ran.append((grid, args, kwargs))
                return SimpleNamespace(name="k4_partial", n_regs=80, n_spills=0,
                                       metadata=SimpleNamespace(num_warps=4, shared=39936))
            return launch

    got: list[LaunchResources] = []
    k = _Recording(Kernel(), got)[(384,)]("a", num_warps=4, num_stages=3)
    assert k.name == "k4_partial" and ran == [((384,), ("a",), {"num_warps": 4, "num_stages": 3})]
    assert got == [LaunchResources("k4_partial", num_warps=4, regs=80, spills=0, shared=39936, programs=384)]
    assert got[0].resident() == 5


def test_a_deep_one_row_step_holds_its_dot_operands_past_what_a_thread_has():
    """With a few rows the MMA takes its operands from registers: one row, 32 columns, 4 warps,
    a 1,024-deep step holds A (16 × 1024, whole in each warp) and B (1024 × 32, split) —
    384 registers a thread — and spills (Triton's ptxas for sm_90a: 19,888 bytes of spill
    stores; it ran 19.0 μs on an H200 where the model had priced 14.4); 512 deep it does not
    (144 registers compiled)."""
    from mugraph.core.benchmarks.handwritten import gemv

    kg = gemv(1, 8192, 3072, 32, 128, "residual", "bfloat16")
    op = next(o for o in kg.ops if o.kind == "graph_defined")
    deep, half = (KernelConfig(num_warps=4, num_stages=3, chunk=c) for c in (8, 4))
    assert residency(op, deep, H200)["regs"] > 255 >= residency(op, half, H200)["regs"]
    dram = for_timing(H200, "dram")
    assert estimate(kg, dram, {op.id: deep}) > estimate(kg, dram, {op.id: half})  # 19.0 and 16.1 μs measured
