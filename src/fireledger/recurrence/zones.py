"""IANA zones, loaded only from the pinned ``tzdata`` package.

Hosts carry their own (often older) zone data; fireledger never reads it, so a fire's instant depends
only on the pinned package whose version (:data:`TZDATA_VERSION`) is recorded on every fire.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from zoneinfo import ZoneInfo

import tzdata

from .errors import RecurrenceError

#: The IANA release of the zone rules in use, e.g. ``"2026f"``.
TZDATA_VERSION: str = tzdata.IANA_VERSION


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """Every zone name the pinned package ships (canonical names and links)."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    names = {line.strip() for line in text.splitlines() if line.strip()}
    names.add("UTC")
    return frozenset(names)


@lru_cache(maxsize=4096)
def load_zone(name: str, field: str = "zone") -> ZoneInfo:
    """Return the zone ``name`` built from the pinned tzdata package.

    Raises :class:`RecurrenceError` naming ``field`` for a name that is not an IANA zone.
    """
    if not isinstance(name, str) or not name:
        raise RecurrenceError(field, "must be an IANA zone name such as Europe/London")
    if name not in zone_names():
        raise RecurrenceError(field, f"{name!r} is not an IANA zone name (e.g. Europe/London, UTC)")
    parts = name.split("/")
    res = resources.files("tzdata.zoneinfo")
    for part in parts:
        res = res.joinpath(part)
    with res.open("rb") as fh:
        return ZoneInfo.from_file(fh, key=name)
