"""The planes' sleeps and poll intervals (issue 15; decision 0150), as settings.

Pure: :meth:`Pacing.from_env` parses a mapping (the process environment is read by
:mod:`fireledger.settings`, which holds the result as ``Settings.pacing`` and turns the ``ValueError``
into its ``SettingError``). Each field is set by ``FIRELEDGER_<FIELD>`` upper-cased, a number of
seconds:

* ``timing_gather_s`` (default 0.02): after a cycle that committed fires, the timing loop starts its
  next cycle no sooner than this after the last one was planned to start (decision 0228: a late
  wake-up is not carried into the next window), unless a full batch is waiting. Fires
  due meanwhile are decided together: one transaction, one hand-off to dispatch and one claim round
  for all of them instead of one each. It bounds what it adds to a fire's lateness; it never makes a
  fire early (a cycle still claims only instants ≤ the clock's earliest bound). 0 turns it off.
* ``timing_max_sleep_s`` (default 0.5): the longest the timing loop sleeps with nothing due, which
  bounds how late it sees a definition changed by another process without a notification.
* ``dispatch_settle_gather_s`` (default 0.05): the dispatcher's flusher records attempt results no
  sooner than this after it last started recording them: results that finish meanwhile share one
  transaction (decision 0152), and a claim round that starts meanwhile records them all in its own
  transaction before it claims (decision 0233) — under load, results ride the claims and the flusher
  writes only what no claim took (decision 0253). It delays the recording of results no claim round
  takes, which releases the fire's lease and its tenant's in-flight slot, by at most this; a claim
  round always sees every result finished before it. 0 records at once.
* ``dispatch_idle_s`` (default 0.5): the longest the dispatcher sleeps with nothing to claim, which
  bounds how late a split ``dispatch`` process (no hand-off from a timing plane in its process, no
  notification: SQLite, or PostgreSQL while its ``LISTEN fireledger_fires`` is down, decision 0221)
  starts a fire committed by another process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

#: Upper bound of every pacing setting, in seconds.
MAX_PACING_S = 60.0


@dataclass(frozen=True, slots=True)
class Pacing:
    """Sleeps and poll intervals of the timing and dispatch planes (module docstring)."""

    timing_gather_s: float = 0.02
    timing_max_sleep_s: float = 0.5
    dispatch_idle_s: float = 0.5
    dispatch_settle_gather_s: float = 0.05

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Pacing:
        """The pacing with ``FIRELEDGER_<FIELD>`` overrides from ``env``. Raises ``ValueError`` naming
        the variable when a value is not a number of seconds in range (the gather windows from 0, the
        sleeps above 0; all at most :data:`MAX_PACING_S`)."""
        values: dict[str, float] = {}
        for f in fields(cls):
            name = f"FIRELEDGER_{f.name.upper()}"
            raw = (env.get(name) or "").strip()
            if not raw:
                continue
            try:
                v = float(raw)
            except ValueError:
                v = math.nan
            low_ok = v >= 0 if f.name.endswith("gather_s") else v > 0
            if not (low_ok and v <= MAX_PACING_S):   # also refuses NaN
                floor = "0" if f.name.endswith("gather_s") else "more than 0"
                raise ValueError(f"{name}: {raw!r} is not a number of seconds from {floor} to {MAX_PACING_S:g}")
            values[f.name] = v
        return cls(**values)


#: The variables :meth:`Pacing.from_env` reads.
PACING_VARIABLES: tuple[str, ...] = tuple(f"FIRELEDGER_{f.name.upper()}" for f in fields(Pacing))

__all__ = ["MAX_PACING_S", "PACING_VARIABLES", "Pacing"]
