"""Errors raised by the recurrence compiler.

Every error names the field it is about and the problem, so that an API or CLI can answer
``"<field>: <problem>"`` without a traceback.
"""

from __future__ import annotations

from fireledger.errors import FireledgerError


class RecurrenceError(FireledgerError, ValueError):
    """A definition that cannot be compiled: bad expression, zone, duration or instant."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class NoMatchError(RecurrenceError):
    """The bounded search ended without an instant: the expression never matches.

    Distinct from "the recurrence is exhausted" (a past one-shot, a passed validity window), which
    :func:`fireledger.recurrence.next_after` reports by returning ``None``.
    """
