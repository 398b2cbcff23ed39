"""clock package."""
