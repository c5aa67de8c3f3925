import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import os  # noqa: E402

# tests that pretend a GPU (torch.cuda.is_available patched) call the tuner, which would start
# worker processes that compile ahead for a GPU that is not there (lower.precompile); the
# tests of the pool itself set their own count or pass their own pool
os.environ.setdefault("MUGRAPH_PRECOMPILE_WORKERS", "0")
