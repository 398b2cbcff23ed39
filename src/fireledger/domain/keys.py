"""Deterministic fire identity (DESIGN.md invariant 2).

A fire is named by (tenant, trigger, scheduled instant, sequence): computed, never generated, so two
deciders of one instant compute the same key and collide on the ledger's primary key. The string
form is URL-safe: ``<tenant>.<trigger>.<YYYYMMDDTHHMMSS[ffffff]Z>.<seq>``.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

_INSTANT = "%Y%m%dT%H%M%S"
_KEY = re.compile(r"^([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{1,64})\.(\d{8}T\d{6})(\d{6})?Z\.(\d{1,9})$")


def new_id(prefix: str) -> str:
    """A fresh random identifier such as ``tr_5f2c…`` (URL-safe, no dots)."""
    return f"{prefix}_{secrets.token_hex(8)}"


def to_us(dt: datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (exact, no float rounding)."""
    delta = dt.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    """Inverse of :func:`to_us`: an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=us)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@lru_cache(maxsize=4096)
def _second_text(secs: int) -> str:
    """``YYYYMMDDTHHMMSS`` of a whole second since the epoch (cached: the fires of one busy second
    share it, and the attempt runner names every fire it sends)."""
    return from_us(secs * 1_000_000).strftime(_INSTANT)


@dataclass(frozen=True, slots=True)
class FireKey:
    """The identity of one fire."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int = 0

    @property
    def scheduled(self) -> datetime:
        return from_us(self.scheduled_us)

    def __str__(self) -> str:
        secs, micro = divmod(self.scheduled_us, 1_000_000)
        frac = f"{micro:06d}" if micro else ""
        return f"{self.tenant_id}.{self.trigger_id}.{_second_text(secs)}{frac}Z.{self.seq}"

    @classmethod
    def parse(cls, text: str) -> FireKey:
        """Parse the string form; raises ``ValueError`` naming the problem."""
        m = _KEY.match(text)
        if not m:
            raise ValueError(f"{text!r} is not a fire key (tenant.trigger.YYYYMMDDTHHMMSSZ.seq)")
        dt = datetime.strptime(m.group(3), _INSTANT).replace(tzinfo=UTC)
        us = to_us(dt) + (int(m.group(4)) if m.group(4) else 0)
        return cls(m.group(1), m.group(2), us, int(m.group(5)))


#: The sequence offset of a dead letter's delivery record (decision 0178): the fire ``…Z.<seq>`` that
#: ended dead is delivered to its trigger's dead-letter target by the fire ``…Z.<seq + offset>``
#: (same tenant, trigger and instant): one record per dead fire, by its primary key. Sequences in
#: use are 0 (scheduled, caught up), 1 (manual) and 2 (backfill).
DEAD_LETTER_SEQ = 500_000_000


def dead_letter_key(key: FireKey) -> FireKey:
    """The key of the record that delivers dead fire ``key`` to its dead-letter target."""
    return FireKey(key.tenant_id, key.trigger_id, key.scheduled_us, key.seq + DEAD_LETTER_SEQ)


def dead_fire_key(key: FireKey) -> FireKey:
    """Inverse of :func:`dead_letter_key`: the dead fire a delivery record carries."""
    return FireKey(key.tenant_id, key.trigger_id, key.scheduled_us, key.seq - DEAD_LETTER_SEQ)
