"""Size limits, checked before any work starts.

A huge or hostile input — a dim of 10¹², a constant ``"1e100000000"``, JSON nested
a million deep — fails at once with a one-line error naming the limit, instead of
a ``MemoryError`` from numpy, minutes of big-integer arithmetic, or a
``RecursionError``. Each limit is far above what the benchmarks use (the largest
full-shape tensor has 25 M elements; a saved superoptimize result nests about 10 levels).
"""

from __future__ import annotations

#: One dim of a tensor. Triton's program ids and the generated offsets are 32-bit.
MAX_DIM = 2**31 - 1

#: Elements of one tensor in a graph (same reason: 32-bit element offsets).
MAX_NUMEL = 2**31 - 1

#: Elements of one value ``mg.evaluate`` materializes (2 GiB in float64): a block
#: tile counts once per block and loop iteration it is evaluated for. Pass
#: ``max_elements=`` to ``evaluate`` to allow more.
MAX_EVAL_ELEMENTS = 2**28

#: Decimal digits of a constant's numerator or of its denominator. Every finite
#: float fits (the smallest subnormal, 5e-324, has a 324-digit denominator).
MAX_CONSTANT_DIGITS = 400

#: Characters of a graph name or an input name.
MAX_NAME_CHARS = 128

#: JSON documents (saved graphs, results, cache entries): bytes of the file, nesting
#: depth of arrays and objects, characters of one number literal.
MAX_JSON_BYTES = 64 * 2**20
MAX_JSON_DEPTH = 64
MAX_NUMBER_CHARS = 64
