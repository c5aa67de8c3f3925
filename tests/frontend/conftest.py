import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # the lowered kernels run on the CPU: set before triton is imported

import logging  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def piece_cache(tmp_path_factory):
    """One result cache for the session: a piece met twice (same structure and shapes) is searched once."""
    return str(tmp_path_factory.mktemp("mugraph-pieces"))


@pytest.fixture
def mugraph_log(caplog):
    caplog.set_level(logging.INFO, logger="mugraph")
    return caplog
