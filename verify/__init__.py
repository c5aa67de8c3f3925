"""verify stage (see DESIGN.md)."""
