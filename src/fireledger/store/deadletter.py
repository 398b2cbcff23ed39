"""Dead-letter deliveries inside the dispatch store's transactions (issue 17 item 2, decision 0178).

A trigger version may name a ``dead_letter_target_id``. When one of its fires settles ``failed`` or
``unknown`` — an attempt's result, or the claim finding no attempt left — the same transaction
inserts that fire's *delivery record*: a fire of kind ``dead-letter`` under the derived key
(:func:`fireledger.domain.keys.dead_letter_key`: same tenant, trigger and instant, sequence + 500 000 000),
``pending`` and due at once in the ``catch-up`` lane (recovery work, paced at the tenant's catch-up
share: a long outage's dead letters do not flood the dead-letter target). ``ON CONFLICT DO NOTHING``:
one record per dead fire, whatever redrives follow. A delivery record that itself ends dead is
listed with the tenant's dead letters (and may be redriven) but never begets another.

At the claim, a delivery record is leased like any fire but goes to the version's dead-letter
target (re-checked at dispatch like every target, invariant 12), under the default retry policy
(:func:`delivery_policies`), and carries its dead fire with that fire's attempts
(:func:`load_dead_fire`) so the body can attach the history.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fireledger.domain.keys import FireKey, dead_fire_key, dead_letter_key
from fireledger.domain.model import Fire, FireKind, FireState, Lane, NewFire, Policies

from . import rows as rec

_DEAD = frozenset({FireState.FAILED.value, FireState.UNKNOWN.value})
_DEFAULT = Policies()


def wants_delivery(f: Fire, state: str, policies: Policies) -> bool:
    """Whether ``f`` settling to ``state`` under ``policies`` needs a delivery record."""
    return (str(state) in _DEAD and policies.dead_letter_target_id is not None
            and f.kind != FireKind.DEAD_LETTER)


def record_delivery(c: Any, q: dict[str, str], f: Fire, now_us: int) -> None:
    """Insert the delivery record of dead fire ``f`` (no-op when it exists), in ``c``'s transaction."""
    k = dead_letter_key(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
    c.execute(q["insert_fire"], rec.fire_params(NewFire(
        k.tenant_id, k.trigger_id, k.scheduled_us, k.seq, f.version, FireKind.DEAD_LETTER, Lane.CATCH_UP,
        FireState.PENDING, now_us, f.tzdata_version, "dispatch:dead-letter")))


def delivery_policies(p: Policies) -> Policies:
    """A delivery record's policies: the version's, with the default retry policy (8 attempts, 1 s
    doubling to 5 min, no event-age bound) — the trigger's may be "fail fast", its dead letter's not."""
    return replace(p, max_attempts=_DEFAULT.max_attempts, min_backoff_s=_DEFAULT.min_backoff_s,
                   max_backoff_s=_DEFAULT.max_backoff_s, max_event_age_s=None)


def load_dead_fire(c: Any, q: dict[str, str], f: Fire) -> Fire | None:
    """The dead fire delivery record ``f`` carries, with its attempts (None: it is gone)."""
    k = dead_fire_key(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
    row = c.execute(q["get_fire"], rec.key_params(k)).fetchone()
    if row is None:
        return None
    arows = c.execute(q["attempts_of_trigger_range"], {"tenant_id": k.tenant_id, "trigger_id": k.trigger_id,
                                                       "from_us": k.scheduled_us, "to_us": k.scheduled_us}).fetchall()
    return rec.with_attempts(rec.fire(row), [rec.attempt(r[2:]) for r in arows if r[1] == k.seq])


__all__ = ["delivery_policies", "load_dead_fire", "record_delivery", "wants_delivery"]
