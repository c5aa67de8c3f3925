"""Superoptimize the gated_mlp benchmark (docs/design.md §8.5): `python examples/gated_mlp.py [--batch 8] [--device cpu] [--small]`."""

from _runner import main

if __name__ == "__main__":
    raise SystemExit(main("gated_mlp"))
