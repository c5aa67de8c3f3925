"""Superoptimize the gqa benchmark (docs/design.md §8.5): `python examples/gqa.py [--batch 8] [--device cpu] [--small]`."""

from _runner import main

if __name__ == "__main__":
    raise SystemExit(main("gqa"))
