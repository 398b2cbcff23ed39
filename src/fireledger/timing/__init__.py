"""timing package."""
