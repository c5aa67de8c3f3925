"""Lowering tests run the generated Triton kernels on the CPU under Triton's
interpreter: ``lower.compile(..., device="cpu")`` sets ``TRITON_INTERPRET=1``
around kernel definition and launch; setting it here as well keeps any Triton
import made by a test in interpreter mode."""

import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

# padded lanes divide 0/0 in numpy under the interpreter; they are masked, never stored
warnings.filterwarnings("ignore", category=RuntimeWarning)


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning")
