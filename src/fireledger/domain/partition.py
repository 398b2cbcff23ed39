"""Kept for importers of the old location: the partition hash is pure and lives in
:mod:`fireledger.domain.partition` (issue 14: planes and the registry must not import a surface)."""

from __future__ import annotations

from fireledger.domain.partition import DEFAULT_PARTITIONS, partition_of

__all__ = ["DEFAULT_PARTITIONS", "partition_of"]
