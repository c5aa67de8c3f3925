"""The six benchmarks of DESIGN §7 as Lax programs, and hand-written reference
μGraphs for each (the kernels the search should rediscover).

Every builder takes the batch ``b`` and optional sizes so tests can use reduced
shapes; the defaults are Mirage's full fp16 shapes.
"""

from .programs import PROGRAMS, SMALL, program
from .handwritten import REFERENCES, reference

__all__ = ["PROGRAMS", "REFERENCES", "SMALL", "program", "reference"]
