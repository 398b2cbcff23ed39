"""Verifying and exporting the keyed audit chain (``fireledger audit verify`` / ``export``).

:func:`verify_chain` walks every row in ``seq`` order and recomputes each link with the audit key
(HMAC-SHA256, :func:`fireledger.store.trust.chain_mac`; the key is derived from the KEK, which the
database does not hold). Rows written before migration 0011 carry the old unkeyed SHA-256
(:func:`~fireledger.store.trust.chain_hash`): they are accepted only as the chain's first rows and
only when the next row is the keyed ``audit.seal`` row naming their count and head hash (decision
0090). It reports the **first** row that does not check, by name:

* ``edited``   — the row's hash does not match its own content (a value was changed);
* ``unkeyed``  — the row carries an unkeyed SHA-256 where a keyed link is required: the chain was
  rewritten by someone without the key (e.g. a database writer recomputing it the pre-0011 way);
* ``reordered`` — the row holds content linked for another position (rows swapped or moved: the
  seq is part of the linked content);
* ``missing``  — a gap in ``seq`` (rows deleted), or the chain's head records rows past the last one
  present (rows deleted from the end);
* ``unlinked`` — the row's ``prev_hash`` is not the previous row's hash (rows deleted and the rest
  renumbered, reordered, or a row inserted; before a seal row: the sealed unkeyed rows were rewritten);
* ``unsealed`` — unkeyed rows followed by a keyed row that is not the seal of exactly those rows;
* ``head``     — the head row's hash does not match the last row (the tail was rewritten).

What the key does not cover: whoever holds the KEK (hence the audit key) *and* can write the database
can rewrite the chain consistently. The remedy is an anchor outside both: ``fireledger audit export``
shipped regularly to write-once storage; ``verify --anchor FILE`` checks that every ``(seq, hash)`` of
such an earlier export (or of a saved ``head`` line) is still in the chain (:func:`check_anchor`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from fireledger.domain.trust_records import GENESIS_HASH, SEAL_ACTION, AuditEntry, chain_hash, chain_mac
from fireledger.errors import FireledgerError

PAGE = 1000


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The outcome of a verification: ``ok``, rows checked, the head, the first row that does not
    check (``broken_seq``, ``problem``) and how many unkeyed pre-0011 rows a seal covers."""

    ok: bool
    rows: int
    head_seq: int
    head_hash: str
    broken_seq: int | None = None
    problem: str | None = None
    sealed_rows: int = 0

    def line(self) -> str:
        if self.ok:
            sealed = (f" (rows 1–{self.sealed_rows} unkeyed, written before the upgrade, sealed by row "
                      f"{self.sealed_rows + 1})") if self.sealed_rows else ""
            return (f"audit chain intact: {self.rows} rows, keyed{sealed}, head seq {self.head_seq}, "
                    f"hash {self.head_hash}")
        return f"audit chain broken at row {self.broken_seq}: {self.problem}"


def iter_rows(store: Any, tenant_id: str | None = None) -> Iterator[AuditEntry]:
    """Every audit row (of one tenant, or all) in seq order, paged."""
    after = 0
    while True:
        page = store.trust.audit_rows(after, PAGE, tenant_id)
        if not page:
            return
        yield from page
        after = page[-1].seq


def _link(key: bytes, seq: int, row: AuditEntry, *, keyed: bool) -> str:
    content = (seq, row.tenant_id, row.actor, row.action, row.at_us, row.prior, row.new, row.prev_hash)
    return chain_mac(key, *content) if keyed else chain_hash(*content)


def _moved_from(key: bytes, row: AuditEntry, window: int = 1000) -> int | None:
    """The seq whose link this row's content carries, when it was written at another position."""
    for seq in range(max(1, row.seq - window), row.seq + window + 1):
        if seq != row.seq and row.hash in (_link(key, seq, row, keyed=True), _link(key, seq, row, keyed=False)):
            return seq
    return None


def _seals(row: AuditEntry, legacy: int, prev_hash: str) -> bool:
    """Whether keyed ``row`` is the seal of exactly the ``legacy`` unkeyed rows ending at ``prev_hash``."""
    if row.action != SEAL_ACTION or row.new is None:
        return False
    try:
        new = json.loads(row.new)
    except ValueError:
        return False
    return (isinstance(new, dict) and new.get("sealed_rows") == legacy and new.get("sealed_hash") == prev_hash
            and row.prev_hash == prev_hash)


def verify_chain(store: Any, key: bytes | None = None) -> ChainReport:
    """Recompute the whole chain under ``key`` (default: the store's audit key, derived from the KEK;
    raises ``KekError`` without one); see the module docstring for what is reported."""
    if key is None:
        key = store.trust.audit_key
    expected_seq = 1
    prev_hash = GENESIS_HASH
    legacy = 0          # unkeyed rows seen (only as a prefix)
    keyed_seen = False
    n = 0
    for row in iter_rows(store):
        n += 1

        def broken(problem: str, at: int, row: AuditEntry = row, n: int = n) -> ChainReport:
            return ChainReport(False, n, row.seq, row.hash, at, problem)

        if row.seq != expected_seq:
            gap = (f"row {expected_seq} is missing" if row.seq == expected_seq + 1
                   else f"rows {expected_seq}–{row.seq - 1} are missing")
            return broken(f"missing: {gap} (deleted)", expected_seq)
        if row.hash == _link(key, row.seq, row, keyed=True):
            if legacy and not keyed_seen and not _seals(row, legacy, prev_hash):
                if row.prev_hash != prev_hash and row.action == SEAL_ACTION:
                    return broken(f"unlinked: row {row.seq} seals unkeyed rows whose head hash is no longer "
                                  f"row {row.seq - 1}'s (the unkeyed rows 1–{legacy} were rewritten)", row.seq)
                return broken(f"unsealed: rows 1–{legacy} carry unkeyed hashes and row {row.seq} is not the "
                              "keyed seal of them (rewritten without the key)", 1)
            keyed_seen = True
        elif row.hash == _link(key, row.seq, row, keyed=False):
            if keyed_seen or row.seq != legacy + 1:
                return broken(f"unkeyed: row {row.seq} carries an unkeyed SHA-256 where a keyed link is "
                              "required (rewritten by someone without the audit key)", row.seq)
            legacy += 1
        else:
            moved = _moved_from(key, row)
            if moved is not None:
                return broken(f"reordered: row {row.seq} holds the content written as row {moved}", row.seq)
            hint = "" if keyed_seen else " — or the KEK given is not the deployment's"
            return broken(f"edited: row {row.seq}'s hash does not match its content "
                          f"(now: action {row.action!r} by {row.actor!r}; a value was changed{hint})", row.seq)
        if row.prev_hash != prev_hash:
            return broken(f"unlinked: row {row.seq}'s prev_hash is not row {row.seq - 1}'s hash "
                          "(rows were deleted and renumbered, reordered, or inserted)", row.seq)
        prev_hash = row.hash
        expected_seq += 1
    sealed = legacy if keyed_seen else 0
    head_seq, head_hash = store.trust.audit_head()
    last = expected_seq - 1
    if legacy and not keyed_seen:
        return ChainReport(False, n, head_seq, head_hash, 1,
                           f"unkeyed: rows 1–{legacy} carry unkeyed SHA-256 hashes and no keyed seal follows "
                           "them (the chain was rewritten by someone without the audit key)")
    if head_seq > last:
        gap = f"row {last + 1} is missing" if head_seq == last + 1 else f"rows {last + 1}–{head_seq} are missing"
        return ChainReport(False, n, head_seq, head_hash, last + 1,
                           f"missing: {gap} (the chain head records {head_seq} rows; deleted from the end)",
                           sealed)
    if head_seq != last or head_hash != prev_hash:
        return ChainReport(False, n, head_seq, head_hash, last,
                           f"head: the chain head (seq {head_seq}) does not match row {last}'s hash "
                           "(the tail was rewritten)", sealed)
    return ChainReport(True, n, head_seq, head_hash, sealed_rows=sealed)


class AnchorError(FireledgerError, ValueError):
    """An anchor file that cannot be read as JSON lines with ``seq`` and ``hash`` (names the line)."""


def read_anchor(lines: Iterable[str]) -> list[tuple[int, str]]:
    """``(seq, hash)`` pairs from an earlier ``audit export`` (or saved ``audit head --json`` lines)."""
    out: list[tuple[int, str]] = []
    seen = 0
    for i, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            raise AnchorError(f"--anchor: line {i} is not JSON") from None
        seq, h = (obj.get("seq"), obj.get("hash")) if isinstance(obj, dict) else (None, None)
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(h, str) or len(h) != 64:
            raise AnchorError(f"--anchor: line {i} needs \"seq\" (an integer ≥ 0) and \"hash\" (64 hex digits)")
        if seq == 0 and h != GENESIS_HASH:
            raise AnchorError(f"--anchor: line {i} is seq 0 (an empty chain) with a hash other than the genesis")
        seen += 1
        if seq:
            out.append((seq, h))
    if not seen:
        raise AnchorError("--anchor: the file holds no rows")
    return out


def check_anchor(store: Any, anchor: list[tuple[int, str]]) -> ChainReport | None:
    """None when every anchored ``(seq, hash)`` is still the chain's row of that seq; else a report
    naming the first that is not (a rewrite the key alone could not reveal: see the module docstring)."""
    want = dict(anchor)
    if not want:
        return None   # only an empty chain's head was anchored: nothing to compare
    head_seq, head_hash = store.trust.audit_head()
    for row in iter_rows(store):
        h = want.pop(row.seq, None)
        if h is not None and h != row.hash:
            return ChainReport(False, row.seq, head_seq, head_hash, row.seq,
                               f"anchored: row {row.seq}'s hash differs from the anchor's (the chain was "
                               "rewritten after the anchor was taken, by someone holding the audit key)")
        if not want:
            return None
    first = min(want)
    return ChainReport(False, head_seq, head_seq, head_hash, first,
                       f"anchored: row {first} of the anchor is no longer in the chain (rows deleted or the "
                       "chain rewritten shorter)")


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


__all__ = ["AnchorError", "ChainReport", "check_anchor", "export_rows", "iter_rows", "read_anchor",
           "verify_chain"]
