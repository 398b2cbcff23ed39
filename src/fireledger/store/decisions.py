"""The batched statements of :meth:`SqlTiming.apply_decisions` (SQL as data, decision 0135).

A batch of decisions is committed by ONE statement per kind of write, each taking the whole batch as
one JSON array parameter (``json_each`` on SQLite, ``jsonb_array_elements`` on PostgreSQL — as the
dispatch side's id lists), so the statement text is fixed and a batch of a thousand fires is three
statements, not two thousand:

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
else sends the batch to the row-by-row path. Arrays are in trigger-id order, the order every
committer locks due rows in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fireledger.domain.model import Advance, FireState, NewFire

from . import queries

_INSERT_COLS = (
    "tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause, decided_us, decided_by, "
    "dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us, eps_us, eps_source"
)
# Element layout of a fire: the values of fire_row() in this order (dispatched_us is NULL and
# attempts 0 for every decided fire, so they are constants, not elements).
_FIRE_FIELDS = ("tenant_id", "trigger_id", "scheduled_us", "seq", "version", "kind", "lane", "state", "cause",
                "decided_us", "decided_by", "finished_us", "tzdata_version", "next_attempt_us", "eps_us",
                "eps_source")
_PG_TYPES = {"scheduled_us": "bigint", "seq": "bigint", "version": "bigint", "decided_us": "bigint",
             "finished_us": "bigint", "next_attempt_us": "bigint", "eps_us": "bigint"}


def _sqlite_value(i: int) -> str:
    return f"json_extract(value, '$[{i}]')"


def _pg_value(i: int, name: str) -> str:
    t = _PG_TYPES.get(name)
    return f"CAST(j->>{i} AS {t})" if t else f"j->>{i}"


def _select(value: list[str]) -> str:
    by_name = dict(zip(_FIRE_FIELDS, value, strict=True))
    cols = [by_name.get(c, "NULL" if c == "dispatched_us" else "0") for c in _INSERT_COLS.split(", ")]
    return ", ".join(cols)


_SQLITE_INSERT = (
    f"INSERT INTO fires ({_INSERT_COLS}) "
    f"SELECT {_select([_sqlite_value(i) for i in range(len(_FIRE_FIELDS))])} FROM json_each(:fires) "
    "WHERE true ON CONFLICT DO NOTHING"   # `WHERE true`: SQLite's parser needs it before ON CONFLICT
)
_PG_INSERT = (
    f"INSERT INTO fires ({_INSERT_COLS}) "
    f"SELECT {_select([_pg_value(i, n) for i, n in enumerate(_FIRE_FIELDS)])} "
    "FROM jsonb_array_elements(CAST(:fires AS jsonb)) j ON CONFLICT DO NOTHING"
)
# Advance elements: [trigger_id, expected_next_us, expected_version, new_next_us, new_version].
_SQLITE_ADVANCE = (
    "UPDATE due SET next_us = json_extract(j.value, '$[3]'), version = json_extract(j.value, '$[4]') "
    "FROM json_each(:advances) j WHERE due.trigger_id = json_extract(j.value, '$[0]') "
    "AND due.next_us = json_extract(j.value, '$[1]') AND due.version = json_extract(j.value, '$[2]')"
)
_PG_ADVANCE = (
    "UPDATE due d SET next_us = CAST(j->>3 AS bigint), version = CAST(j->>4 AS bigint) "
    "FROM jsonb_array_elements(CAST(:advances AS jsonb)) j WHERE d.trigger_id = j->>0 "
    "AND d.next_us = CAST(j->>1 AS bigint) AND d.version = CAST(j->>2 AS bigint)"
)
_SQLITE_RETIRE = (
    "DELETE FROM due WHERE (trigger_id, next_us, version) IN (SELECT json_extract(value, '$[0]'), "
    "json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(:advances))"
)
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


def fires_json(fires: Sequence[NewFire]) -> str:
    """The ``:fires`` parameter: one array per fire (the columns ``rows.fire_params`` binds, in
    ``_FIRE_FIELDS`` order; live fires get their first dispatch time, terminal ones their finish)."""
    out = []
    for f in fires:
        state = f.state
        pending = state is FireState.PENDING
        out.append((f.tenant_id, f.trigger_id, f.scheduled_us, f.seq, f.version, f.kind.value, f.lane.value,
                    state.value, f.cause, f.decided_us, f.decided_by,
                    None if state in _LIVE else f.decided_us, f.tzdata_version,
                    (f.decided_us if f.not_before_us is None else f.not_before_us) if pending else None,
                    f.eps_us, f.eps_source))
    return json.dumps(out, separators=(",", ":"))


def advances_json(advances: Sequence[Advance]) -> str:
    """The ``:advances`` parameter: ``[trigger_id, expected_next_us, expected_version, new_next_us,
    new_version]`` per due row."""
    return json.dumps([(a.trigger_id, a.expected_next_us, a.expected_version, a.new_next_us, a.new_version)
                       for a in advances], separators=(",", ":"))


__all__ = ["DECISION_QUERIES", "advances_json", "fires_json"]
