"""Tests of the verify stage run torch single-threaded: on small shapes thread
start-up dominates (10× slower on a 2-core machine), and the suite runs beside others."""

import torch

torch.set_num_threads(1)
