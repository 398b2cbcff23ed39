"""observe package."""
