import sys
from pathlib import Path

# the bad-input table is a module beside its test
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
