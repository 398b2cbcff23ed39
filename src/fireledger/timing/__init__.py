"""The timing plane: decides fires and commits them before anything is delivered."""

from .loop import TickResult, TimingLoop

__all__ = ["TickResult", "TimingLoop"]
