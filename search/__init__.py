"""search stage (see DESIGN.md)."""
