import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_price_record(monkeypatch):
    """Each test starts with no price seen: the search's pricing remembers the longest one in
    its process (``search.derive._LONGEST_PRICE_S``), which would let one test's prices
    shorten another's."""
    from search import derive

    monkeypatch.setattr(derive, "_LONGEST_PRICE_S", 0.0)
