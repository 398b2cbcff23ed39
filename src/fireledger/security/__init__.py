"""security package."""
