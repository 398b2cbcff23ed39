"""Fault-injection ("falsification") suite: real processes, real PostgreSQL, real clocks."""
