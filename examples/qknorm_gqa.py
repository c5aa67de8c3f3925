"""Superoptimize the qknorm_gqa benchmark (docs/design.md §8.5): `python examples/qknorm_gqa.py [--batch 8] [--device cpu] [--small]`."""

from _runner import main

if __name__ == "__main__":
    raise SystemExit(main("qknorm_gqa"))
