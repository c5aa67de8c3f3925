"""The PyTorch front door (docs/design.md §10): capture PyTorch code, cut it into
Lax pieces, superoptimize each, run the result as a ``torch.compile`` backend.

    import mugraph.frontend as mf
    cap = mf.from_torch(module, x)          # ATen graph, pieces, library ops
    cap.pieces[0].program                   # a mugraph Program (Lax)
    fast = cap.compile(time_limit=30)       # pieces superoptimized; the rest torch
    torch.compile(module, backend="mugraph", options={"time_limit": 30})
    model.forward = mf.saved_forward(model, "compiled/")   # compiled once, loaded by later processes

Part of the product layer: it imports the pipeline (``mg.superoptimize``) and the
lowering. Importing it registers the ``"mugraph"`` dynamo backend (the package
also names it under the ``torch_dynamo_backends`` entry point, so
``backend="mugraph"`` works without the import once mugraph is installed).
"""

from __future__ import annotations

from .aten import ROWS, Unmapped, rotate_half
from .backend import mugraph_backend, recent_graphs
from .capture import NodeInfo, probe, trace
from .graph import Captured, from_torch
from .options import FrontendOptions
from .partition import Piece, partition
from .pieces import BuiltPiece
from .saved import SavedForward, saved_forward

__all__ = ["from_torch", "Captured", "FrontendOptions", "mugraph_backend", "recent_graphs", "Piece", "BuiltPiece", "NodeInfo",
           "ROWS", "Unmapped", "partition", "probe", "trace", "rotate_half", "saved_forward", "SavedForward"]
