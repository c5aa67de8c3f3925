"""Superoptimize the ntrans benchmark (docs/design.md §8.5): `python examples/ntrans.py [--batch 8] [--device cpu] [--small]`."""

from _runner import main

if __name__ == "__main__":
    raise SystemExit(main("ntrans"))
