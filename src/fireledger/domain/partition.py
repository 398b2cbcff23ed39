"""Stable partition of a trigger (the timing plane's unit of ownership)."""

from __future__ import annotations

import hashlib

DEFAULT_PARTITIONS = 256


def partition_of(trigger_id: str, partitions: int = DEFAULT_PARTITIONS) -> int:
    """A stable hash of the trigger id modulo ``partitions`` (same on every host and run)."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    digest = hashlib.blake2b(trigger_id.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") % partitions
