"""The batched statements of :meth:`SqlTiming.apply_decisions` (SQL as data, decision 0135).

A batch of decisions is committed by ONE statement per kind of write, with no Python work and no
round trip per row: on PostgreSQL each statement takes the whole batch as one JSON array parameter
(``jsonb_array_elements``, as the dispatch side's id lists: one round trip, one execution); on
SQLite — in process, no round trips — the statement is prepared once and stepped per element by
``executemany``, which measured faster than ``json_each`` (7.4 vs 9.3 µs per fire inserted, 3.5 vs
4.9 per due row moved: the JSON is parsed again for every column). So a batch of a thousand fires is
three statements, not two thousand:

* ``tm_insert_fires`` — every fire of the batch, ``ON CONFLICT DO NOTHING`` (a key that exists was
  decided elsewhere: it inserts nothing);
* ``tm_advance_due`` — the due rows' compare-and-set forward, each element matching its row by
  primary key *and* the expected ``(next_us, version)``: zero rows for an element is normal (moved,
  decided elsewhere), more than one impossible (primary key);
* ``tm_retire_due`` — the same compare-and-set for rows whose schedule ended (deleted);
* ``tm_versions`` — the read before them: what planning needs of the batch's trigger versions
  (schedule text and policies, not the sealed payload), one statement for the versions not cached.

The caller compares each statement's row count with the number of elements: equal means every
element matched exactly once (keys are distinct within a batch, which the caller checks), anything
else sends the batch to the row-by-row path. Elements are in trigger-id order, the order every
committer locks due rows in (on PostgreSQL the CAS is a nested loop driven by the array — a function
scan is estimated at 100 rows — so rows are locked in array order; decision 0135).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fireledger.domain.model import Advance, FireState, NewFire

from . import queries

_INSERT_COLS = (
    "tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause, decided_us, decided_by, "
    "dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us, eps_us, eps_source, dst, specs"
)
# Element layout of a fire: the values of fire_row() in this order (dispatched_us is NULL and
# attempts 0 for every decided fire, so they are constants, not elements).
_FIRE_FIELDS = ("tenant_id", "trigger_id", "scheduled_us", "seq", "version", "kind", "lane", "state", "cause",
                "decided_us", "decided_by", "finished_us", "tzdata_version", "next_attempt_us", "eps_us",
                "eps_source", "dst", "specs")
_PG_TYPES = {"scheduled_us": "bigint", "seq": "bigint", "version": "bigint", "decided_us": "bigint",
             "finished_us": "bigint", "next_attempt_us": "bigint", "eps_us": "bigint"}


def _pg_value(i: int, name: str) -> str:
    t = _PG_TYPES.get(name)
    return f"CAST(j->>{i} AS {t})" if t else f"j->>{i}"


def _select(value: list[str]) -> str:
    by_name = dict(zip(_FIRE_FIELDS, value, strict=True))
    cols = [by_name.get(c, "NULL" if c == "dispatched_us" else "0") for c in _INSERT_COLS.split(", ")]
    return ", ".join(cols)


_SQLITE_INSERT = (
    f"INSERT INTO fires ({_INSERT_COLS}) VALUES ({_select(['?'] * len(_FIRE_FIELDS))}) ON CONFLICT DO NOTHING"
)
_PG_INSERT = (
    f"INSERT INTO fires ({_INSERT_COLS}) "
    f"SELECT {_select([_pg_value(i, n) for i, n in enumerate(_FIRE_FIELDS)])} "
    "FROM jsonb_array_elements(CAST(:fires AS jsonb)) j ON CONFLICT DO NOTHING"
)
# Advance elements: [trigger_id, expected_next_us, expected_version, new_next_us, new_version]
# (SQLite's statement binds them in that order too: ?1 … ?5).
_SQLITE_ADVANCE = (
    "UPDATE due SET next_us = ?4, version = ?5 WHERE trigger_id = ?1 AND next_us = ?2 AND version = ?3"
)
_PG_ADVANCE = (
    "UPDATE due d SET next_us = CAST(j->>3 AS bigint), version = CAST(j->>4 AS bigint) "
    "FROM jsonb_array_elements(CAST(:advances AS jsonb)) j WHERE d.trigger_id = j->>0 "
    "AND d.next_us = CAST(j->>1 AS bigint) AND d.version = CAST(j->>2 AS bigint)"
)
_SQLITE_RETIRE = "DELETE FROM due WHERE trigger_id = ?1 AND next_us = ?2 AND version = ?3"
_PG_RETIRE = (
    "DELETE FROM due d USING jsonb_array_elements(CAST(:advances AS jsonb)) j WHERE d.trigger_id = j->>0 "
    "AND d.next_us = CAST(j->>1 AS bigint) AND d.version = CAST(j->>2 AS bigint)"
)

# What planning needs of a batch's trigger versions (schedule text and policies; not the sealed
# payload, which the timing plane never reads), for ids given as [[trigger_id, version], ...].
_SQLITE_VERSIONS = (
    "SELECT v.trigger_id, v.version, v.schedule, v.policies FROM json_each(:ids) j JOIN trigger_versions v "
    "ON v.trigger_id = json_extract(j.value, '$[0]') AND v.version = json_extract(j.value, '$[1]')"
)
_PG_VERSIONS = (
    "SELECT v.trigger_id, v.version, v.schedule, v.policies FROM jsonb_array_elements(CAST(:ids AS jsonb)) j "
    "JOIN trigger_versions v ON v.trigger_id = j->>0 AND v.version = CAST(j->>1 AS bigint)"
)

DECISION_QUERIES: dict[str, str] = {
    "tm_versions": _SQLITE_VERSIONS,
    "tm_insert_fires": _SQLITE_INSERT,
    "tm_advance_due": _SQLITE_ADVANCE,
    "tm_retire_due": _SQLITE_RETIRE,
}

queries.register(DECISION_QUERIES, {"postgres": {
    "tm_versions": _PG_VERSIONS, "tm_insert_fires": _PG_INSERT, "tm_advance_due": _PG_ADVANCE,
    "tm_retire_due": _PG_RETIRE}})

_LIVE = (FireState.PENDING, FireState.HELD)


def fire_rows(fires: Sequence[NewFire]) -> list[tuple[Any, ...]]:
    """One element per fire: the columns ``rows.fire_params`` binds, in ``_FIRE_FIELDS`` order (live
    fires get their first dispatch time — the smeared one when set —, terminal ones their finish)."""
    out = []
    for f in fires:
        state = f.state
        pending = state is FireState.PENDING
        out.append((f.tenant_id, f.trigger_id, f.scheduled_us, f.seq, f.version, f.kind.value, f.lane.value,
                    state.value, f.cause, f.decided_us, f.decided_by,
                    None if state in _LIVE else f.decided_us, f.tzdata_version,
                    (f.decided_us if f.not_before_us is None else f.not_before_us) if pending else None,
                    f.eps_us, f.eps_source, f.dst, f.specs))
    return out


def advance_rows(advances: Sequence[Advance]) -> list[tuple[Any, ...]]:
    """One element per due row: ``(trigger_id, expected_next_us, expected_version, new_next_us,
    new_version)``."""
    return [(a.trigger_id, a.expected_next_us, a.expected_version, a.new_next_us, a.new_version)
            for a in advances]


def write_batch(cur: Any, engine: str, q: dict[str, str], name: str, elements: list[tuple[Any, ...]]) -> int:
    """Run the batched statement ``name`` over ``elements``; returns the rows it changed. SQLite:
    the statement prepared once and stepped per element by ``executemany`` (no Python per row, no
    round trip); PostgreSQL: one statement over the elements as one JSON array (one round trip,
    one execution)."""
    if engine == "sqlite":
        if name == "tm_retire_due":
            elements = [e[:3] for e in elements]
        cur.executemany(q[name], elements)
    else:
        cur.execute(q[name], {_PARAM[name]: json.dumps(elements, separators=(",", ":"))})
    return int(cur.rowcount)


_PARAM = {"tm_insert_fires": "fires", "tm_advance_due": "advances", "tm_retire_due": "advances"}


__all__ = ["DECISION_QUERIES", "advance_rows", "fire_rows", "write_batch"]
