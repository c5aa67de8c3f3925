"""Superoptimize the rmsnorm_matmul benchmark (docs/design.md §8.5): `python examples/rmsnorm_matmul.py [--batch 8] [--device cpu] [--small]`."""

from _runner import main

if __name__ == "__main__":
    raise SystemExit(main("rmsnorm_matmul"))
