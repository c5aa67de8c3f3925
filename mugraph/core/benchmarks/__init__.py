"""The six benchmarks of docs/design.md §8.5 as Lax programs, and hand-written reference
μGraphs for each (the kernels the search should rediscover); decode-shaped
attention programs (:data:`DECODE`), which have no hand-written μGraph.

Every builder takes the batch ``b`` and optional sizes so tests can use reduced
shapes; the defaults are Mirage's full fp16 shapes.
"""

from .programs import DECODE, PREFILL, PROGRAMS, SMALL, decode_attention, prefill_attention, program
from .handwritten import REFERENCES, reference

__all__ = ["DECODE", "PREFILL", "PROGRAMS", "REFERENCES", "SMALL", "decode_attention", "prefill_attention", "program",
           "reference"]
