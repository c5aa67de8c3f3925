"""lower stage (see DESIGN.md)."""
