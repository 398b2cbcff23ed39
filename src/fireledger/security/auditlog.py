"""Verifying and exporting the hash-chained audit (``fireledger audit verify`` / ``export``).

:func:`verify_chain` walks every row in ``seq`` order and recomputes the chain
(:func:`fireledger.store.trust.chain_hash`). It reports the **first** broken row, by name:

* ``edited``   — the row's hash does not match its own content (a value was changed);
* ``reordered`` — the row holds content hashed for another position (rows swapped or moved: the
  seq is part of the hashed content);
* ``missing``  — a gap in ``seq`` (rows deleted), or the chain's head records rows past the last one
  present (rows deleted from the end);
* ``unlinked`` — the row's ``prev_hash`` is not the previous row's hash (rows deleted and the rest
  renumbered, reordered, or a row inserted);
* ``head``     — the head row's hash does not match the last row (the tail was rewritten).

A chain rewritten consistently from some row onwards *including* the head row is only detectable
against an earlier export (compare its last ``hash``): export regularly to write-once storage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from fireledger.store.trust import GENESIS_HASH, AuditEntry, chain_hash

PAGE = 1000


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The outcome of a verification: ``ok``, rows checked, the head, and the first broken row."""

    ok: bool
    rows: int
    head_seq: int
    head_hash: str
    broken_seq: int | None = None
    problem: str | None = None

    def line(self) -> str:
        if self.ok:
            return f"audit chain intact: {self.rows} rows, head seq {self.head_seq}, hash {self.head_hash}"
        return f"audit chain broken at row {self.broken_seq}: {self.problem}"


def iter_rows(store: Any, tenant_id: str | None = None) -> Iterator[AuditEntry]:
    """Every audit row (of one tenant, or all) in seq order, paged."""
    after = 0
    while True:
        page = store.audit_rows(after, PAGE, tenant_id)
        if not page:
            return
        yield from page
        after = page[-1].seq


def _moved_from(row: AuditEntry, window: int = 1000) -> int | None:
    """The seq whose hash this row's content carries, when it was written at another position."""
    for seq in range(max(1, row.seq - window), row.seq + window + 1):
        if seq != row.seq and chain_hash(seq, row.tenant_id, row.actor, row.action, row.at_us, row.prior,
                                         row.new, row.prev_hash) == row.hash:
            return seq
    return None


def verify_chain(store: Any) -> ChainReport:
    """Recompute the whole chain; see the module docstring for what is reported."""
    expected_seq = 1
    prev_hash = GENESIS_HASH
    n = 0
    for row in iter_rows(store):
        n += 1
        if row.seq != expected_seq:
            gap = (f"row {expected_seq} is missing" if row.seq == expected_seq + 1
                   else f"rows {expected_seq}–{row.seq - 1} are missing")
            return ChainReport(False, n, row.seq, row.hash, expected_seq, f"missing: {gap} (deleted)")
        own = chain_hash(row.seq, row.tenant_id, row.actor, row.action, row.at_us, row.prior, row.new,
                         row.prev_hash)
        if own != row.hash:
            moved = _moved_from(row)
            if moved is not None:
                return ChainReport(False, n, row.seq, row.hash, row.seq,
                                   f"reordered: row {row.seq} holds the content written as row {moved}")
            return ChainReport(False, n, row.seq, row.hash, row.seq,
                               f"edited: row {row.seq}'s hash does not match its content "
                               f"(now: action {row.action!r} by {row.actor!r}; a value was changed)")
        if row.prev_hash != prev_hash:
            return ChainReport(False, n, row.seq, row.hash, row.seq,
                               f"unlinked: row {row.seq}'s prev_hash is not row {row.seq - 1}'s hash "
                               "(rows were deleted and renumbered, reordered, or inserted)")
        prev_hash = row.hash
        expected_seq += 1
    head_seq, head_hash = store.audit_head()
    last = expected_seq - 1
    if head_seq > last:
        gap = f"row {last + 1} is missing" if head_seq == last + 1 else f"rows {last + 1}–{head_seq} are missing"
        return ChainReport(False, n, head_seq, head_hash, last + 1,
                           f"missing: {gap} (the chain head records {head_seq} rows; deleted from the end)")
    if head_seq != last or head_hash != prev_hash:
        return ChainReport(False, n, head_seq, head_hash, last,
                           f"head: the chain head (seq {head_seq}) does not match row {last}'s hash "
                           "(the tail was rewritten)")
    return ChainReport(True, n, head_seq, head_hash)


def export_rows(store: Any, out: TextIO, tenant_id: str | None = None) -> int:
    """Write every audit row (of one tenant, or all) as one JSON object per line; returns the count."""
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    n = 0
    for row in iter_rows(store, tenant_id):
        obj = row.as_json()
        obj["at"] = format_instant(from_us(row.at_us))
        out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
        n += 1
    return n


__all__ = ["ChainReport", "export_rows", "iter_rows", "verify_chain"]
