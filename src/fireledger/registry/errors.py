"""What an act of the registry can refuse. Every refusal means nothing was written.

The surfaces translate them: the API into problem details (``Invalid`` 422 naming each field,
``NotFound`` 404, ``Conflict`` 409, ``LimitReached`` 409 ``limit-reached``), the CLI into a message
naming the flag. Messages name fields and states, never payload content.
"""

from __future__ import annotations

from fireledger.errors import FireledgerError


class RegistryError(FireledgerError):
    """Root of the registry's refusals: the act was not performed and nothing was stored."""


class Invalid(RegistryError):
    """Bad input: ``errors`` lists ``(field, problem)`` pairs, fields named as the API names them
    (``schedule.cron``, ``payload``, ``target_id``…)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {p}" for f, p in errors))
        self.errors = errors


class NotFound(RegistryError):
    """No such object for this tenant (another tenant's object is reported exactly like a missing one)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"no such {what}")
        self.what = what


class Conflict(RegistryError):
    """The object is not in a state that allows the act, or changed meanwhile (a compare-and-set lost):
    ``detail`` says which and what to do."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class LimitReached(Conflict):
    """A per-tenant limit refuses the act (e.g. the number of live triggers)."""


__all__ = ["Conflict", "Invalid", "LimitReached", "NotFound", "RegistryError"]
