"""What every handler needs: the store, the clock and the definition-change hook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from fireledger.clock import Clock
from fireledger.settings import Settings
from fireledger.store import Store


@dataclass(frozen=True)
class ApiContext:
    store: Store
    clock: Clock
    on_definition_change: Callable[[], None]
    allow_private_targets: bool
    #: Replaces the system resolver for ownership challenges (under the egress guard); None: system.
    resolver: Any = None
    #: The process's settings, read once by the entry point; None (tests, embedding): each handler
    #: reads the environment it needs through the owner's helper.
    settings: Settings | None = None

    def now_us(self) -> int:
        """The instant stamped on created/updated records and used as "now" for schedules: the
        clock's *latest* bound (a first instant is never placed inside the uncertainty window)."""
        return self.clock.now().latest_us


def get_ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.fireledger
    return ctx
