"""Superoptimize the lora benchmark (DESIGN §7): `python examples/lora.py [--batch 8] [--device cpu] [--small]`."""

from _runner import main

if __name__ == "__main__":
    raise SystemExit(main("lora"))
