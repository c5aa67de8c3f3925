"""The package version, in one place (the product records it in cache keys)."""

__version__ = "0.1.0"
