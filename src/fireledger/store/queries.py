"""Named SQL queries, shared by both engines (SQL as data).

Placeholders are ``:name``; the PostgreSQL engine rewrites them to psycopg's ``%(name)s``. Where an
engine needs different text, ``OVERRIDES[engine][name]`` replaces the shared query. A shared query
may name the SQLite index it must read (``FROM fires INDEXED BY fires_by_trigger``): the PostgreSQL
text leaves that clause out.
"""

from __future__ import annotations

import re

_FIRE_COLS = (
    "tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause, decided_us, "
    "decided_by, dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us"
)
#: The fire columns every read selects: the written ones, then the redrive's (migration 0014; appended,
#: so positions 0-15 are unchanged).
FIRE_COLS = _FIRE_COLS + ", attempt_base, redriven_us"
#: How many columns :data:`FIRE_COLS` selects (a row that goes on with other columns is cut there).
FIRE_NCOLS = FIRE_COLS.count(",") + 1
#: The fire columns plus the clock evidence (migration 0007), the DST label (migration 0016) and the
#: matched specs (migration 0015): what history and evidence reads select (the dispatch plane's claims
#: keep FIRE_COLS).
FIRE_COLS_EVIDENCE = FIRE_COLS + ", eps_us, eps_source, dst, specs"
TRIGGER_COLS = (
    "t.id, t.tenant_id, t.name, t.state, t.current_version, t.partition, t.created_us, t.updated_us, "
    "d.next_us, t.pause_reason"
)

QUERIES: dict[str, str] = {
    # --- registry -------------------------------------------------------------------------------
    "insert_tenant": "INSERT INTO tenants (id, name, created_us) VALUES (:id, :name, :created_us)",
    "get_tenant": "SELECT id, name, created_us FROM tenants WHERE id = :id AND deleted_us IS NULL",
    "insert_principal": (
        "INSERT INTO principals (id, tenant_id, name, token_hash, roles, created_us) "
        "VALUES (:id, :tenant_id, :name, :token_hash, :roles, :created_us)"
    ),
    "principal_by_token_hash": (
        "SELECT p.id, p.tenant_id, p.name, p.roles, p.created_us, p.revoked_us FROM principals p "
        "JOIN tenants t ON t.id = p.tenant_id "
        "WHERE p.token_hash = :token_hash AND p.revoked_us IS NULL AND t.deleted_us IS NULL"
    ),
    "insert_target": (
        "INSERT INTO targets (id, tenant_id, kind, url, secret, verification_state, verification_token, "
        "created_us) VALUES (:id, :tenant_id, :kind, :url, :secret, :verification_state, "
        ":verification_token, :created_us)"
    ),
    "get_target": (
        "SELECT id, tenant_id, kind, url, secret, verification_state, verification_token, created_us "
        "FROM targets WHERE tenant_id = :tenant_id AND id = :id AND deleted_us IS NULL"
    ),
    "list_targets": (
        "SELECT id, tenant_id, kind, url, secret, verification_state, verification_token, created_us "
        "FROM targets WHERE tenant_id = :tenant_id AND deleted_us IS NULL AND id > :after "
        "ORDER BY id LIMIT :limit"
    ),
    "delete_target": (
        "UPDATE targets SET deleted_us = :now_us WHERE tenant_id = :tenant_id AND id = :id "
        "AND deleted_us IS NULL"
    ),
    "target_in_use": (
        "SELECT t.id FROM triggers t JOIN trigger_versions v ON v.trigger_id = t.id "
        "AND v.version = t.current_version WHERE t.tenant_id = :tenant_id AND v.target_id = :target_id "
        "AND t.state <> 'deleted' LIMIT 1"
    ),
    "insert_trigger": (
        "INSERT INTO triggers (id, tenant_id, name, state, current_version, partition, created_us, "
        "updated_us) VALUES (:id, :tenant_id, :name, :state, :current_version, :partition, :created_us, "
        ":updated_us)"
    ),
    "insert_version": (
        "INSERT INTO trigger_versions (trigger_id, version, tenant_id, schedule, target_id, payload, "
        "policies, tzdata_version, created_us) VALUES (:trigger_id, :version, :tenant_id, :schedule, "
        ":target_id, :payload, :policies, :tzdata_version, :created_us)"
    ),
    "get_trigger": (
        f"SELECT {TRIGGER_COLS} FROM triggers t LEFT JOIN due d ON d.trigger_id = t.id "
        "WHERE t.tenant_id = :tenant_id AND t.id = :id AND t.state <> 'deleted'"
    ),
    "list_triggers": (
        f"SELECT {TRIGGER_COLS} FROM triggers t LEFT JOIN due d ON d.trigger_id = t.id "
        "WHERE t.tenant_id = :tenant_id AND t.state <> 'deleted' AND t.id > :after ORDER BY t.id LIMIT :limit"
    ),
    "get_version": (
        "SELECT trigger_id, version, tenant_id, schedule, target_id, payload, policies, tzdata_version, "
        "created_us FROM trigger_versions WHERE trigger_id = :trigger_id AND version = :version"
    ),
    "update_trigger_version": (
        "UPDATE triggers SET current_version = :new_version, name = :name, updated_us = :now_us "
        "WHERE tenant_id = :tenant_id AND id = :id AND current_version = :expected_version "
        "AND state <> 'deleted'"
    ),
    "update_trigger_state": (
        "UPDATE triggers SET state = :state, updated_us = :now_us, "
        # The resume point: the due index restarts here (the shadow rebuilder and rebuild read it).
        "resumed_us = CASE WHEN :state = 'active' THEN :now_us ELSE resumed_us END "
        "WHERE tenant_id = :tenant_id AND id = :id AND state = :expected_state"
    ),
    "upsert_due": (
        "INSERT INTO due (trigger_id, tenant_id, partition, next_us, version) "
        "VALUES (:trigger_id, :tenant_id, :partition, :next_us, :version) "
        "ON CONFLICT (trigger_id) DO UPDATE SET next_us = excluded.next_us, version = excluded.version"
    ),
    "delete_due": "DELETE FROM due WHERE trigger_id = :trigger_id",
    "bump_definitions": "UPDATE signals SET counter = counter + 1 WHERE name = 'definitions'",
    "definitions_counter": "SELECT counter FROM signals WHERE name = 'definitions'",
    # --- timing ---------------------------------------------------------------------------------
    "due_rows": (
        "SELECT trigger_id, tenant_id, partition, next_us, version FROM due WHERE next_us <= :until_us "
        "ORDER BY next_us LIMIT :limit"
    ),
    "earliest_due": "SELECT MIN(next_us) FROM due",
    "insert_fire": (
        f"INSERT INTO fires ({_FIRE_COLS}, eps_us, eps_source, dst, specs) VALUES (:tenant_id, :trigger_id, "
        ":scheduled_us, :seq, :version, :kind, :lane, :state, :cause, :decided_us, :decided_by, NULL, :finished_us, "
        ":tzdata_version, 0, :next_attempt_us, :eps_us, :eps_source, :dst, :specs) ON CONFLICT DO NOTHING"
    ),
    "delete_fire": (
        "DELETE FROM fires WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "advance_due": (
        "UPDATE due SET next_us = :new_next_us, version = :new_version WHERE trigger_id = :trigger_id "
        "AND next_us = :expected_next_us AND version = :expected_version"
    ),
    "retire_due": (
        "DELETE FROM due WHERE trigger_id = :trigger_id AND next_us = :expected_next_us "
        "AND version = :expected_version"
    ),
    # --- dispatch -------------------------------------------------------------------------------
    "claim_fires": (
        "UPDATE fires SET state = 'dispatching', lease_owner = :owner, next_attempt_us = :lease_until_us, "
        "attempts = attempts + 1, dispatched_us = COALESCE(dispatched_us, :now_us) "
        "WHERE (tenant_id, trigger_id, scheduled_us, seq) IN ("
        "  SELECT tenant_id, trigger_id, scheduled_us, seq FROM fires "
        "  WHERE state IN ('pending', 'dispatching') AND lane = :lane AND next_attempt_us <= :now_us "
        "  ORDER BY next_attempt_us LIMIT :limit) "
        f"RETURNING {_FIRE_COLS}"
    ),
    "insert_attempt": (
        "INSERT INTO attempts (tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, node) "
        "VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :attempt, :started_us, :node) "
        "ON CONFLICT DO NOTHING"
    ),
    "finish_attempt": (
        "UPDATE attempts SET finished_us = :finished_us, result = :result, http_status = :http_status, "
        "error = :error WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq AND attempt = :attempt"
    ),
    # A cause recorded when the fire was decided or released (an overlap note, decision 0060) is kept:
    # a settlement without a cause leaves it, one with a cause puts its own first.
    "settle_fire": (
        "UPDATE fires SET state = :state, cause = CASE WHEN CAST(:cause AS TEXT) IS NULL THEN cause "
        "WHEN cause IS NULL THEN CAST(:cause AS TEXT) ELSE CAST(:cause AS TEXT) || '; ' || cause END, "
        "next_attempt_us = :next_attempt_us, "
        "finished_us = :finished_us, lease_owner = NULL "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        # Matched by primary key only: ``state || ''`` keeps the partial index fires_undelivered
        # (state IN pending/dispatching) out of a generic plan, which could otherwise walk every fire
        # of the instant per settlement (decision 0130: the same guard as dp_lease).
        "AND seq = :seq AND state || '' = 'dispatching' AND lease_owner = :owner AND attempts = :attempt"
    ),
    "set_lease": (
        "UPDATE fires SET next_attempt_us = :until_us WHERE tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us AND seq = :seq "
        "AND lease_owner = :owner AND state = 'dispatching'"
    ),
    "unsealed_target_secrets": (
        "SELECT id, tenant_id, secret FROM targets WHERE substr(secret, 1, 7) <> 'flsec1.' AND secret <> '' "
        "AND id > :after ORDER BY id LIMIT :limit"
    ),
    "replace_target_secret": "UPDATE targets SET secret = :new WHERE id = :id AND secret = :old",
    "targets_by_ids": (
        "SELECT id, tenant_id, kind, url, secret, verification_state, verification_token, created_us "
        "FROM targets WHERE id = :id"
    ),
    # --- history --------------------------------------------------------------------------------
    "list_fires": (
        f"SELECT {FIRE_COLS_EVIDENCE} FROM fires INDEXED BY fires_by_trigger "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND (scheduled_us > :after_us OR (scheduled_us = :after_us AND seq > :after_seq)) "
        "ORDER BY scheduled_us, seq LIMIT :limit"
    ),
    "get_fire": (
        f"SELECT {FIRE_COLS_EVIDENCE} FROM fires WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    # Attempts are keyed by tenant and instant (decision 0210): a trigger's are read through its
    # fires (fires_by_trigger), one primary-key probe per fire, never by walking the tenant's attempts.
    "attempts_of_trigger_range": (
        "SELECT a.scheduled_us, a.seq, a.attempt, a.started_us, a.finished_us, a.result, a.http_status, "
        "a.error, a.node FROM fires f INDEXED BY fires_by_trigger CROSS JOIN attempts a "
        "WHERE f.tenant_id = :tenant_id AND f.trigger_id = :trigger_id "
        "AND f.scheduled_us >= :from_us AND f.scheduled_us <= :to_us AND a.tenant_id = f.tenant_id "
        "AND a.scheduled_us = +f.scheduled_us AND a.trigger_id = f.trigger_id AND a.seq = f.seq "
        "ORDER BY a.scheduled_us, a.seq, a.attempt"
    ),
    "count_fires": "SELECT COUNT(*) FROM fires",
    "oldest_undelivered": "SELECT MIN(scheduled_us) FROM fires WHERE state IN ('pending', 'dispatching')",
    # SQLite has no independent clock: the embedded default has one process and one clock.
    "server_time_us": "SELECT CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)",
}

OVERRIDES: dict[str, dict[str, str]] = {
    "postgres": {
        "server_time_us": "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint",
        "claim_fires": (
            "UPDATE fires SET state = 'dispatching', lease_owner = :owner, "
            "next_attempt_us = :lease_until_us, attempts = attempts + 1, "
            "dispatched_us = COALESCE(dispatched_us, :now_us) "
            "WHERE (tenant_id, trigger_id, scheduled_us, seq) IN ("
            "  SELECT tenant_id, trigger_id, scheduled_us, seq FROM fires "
            "  WHERE state IN ('pending', 'dispatching') AND lane = :lane AND next_attempt_us <= :now_us "
            "  ORDER BY next_attempt_us LIMIT :limit FOR UPDATE SKIP LOCKED) "
            f"RETURNING {_FIRE_COLS}"
        ),
    },
}

_NAMED = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
#: SQLite's ``INDEXED BY <index>`` (a query that must read that index: SQLite keeps no statistics, and
#: preparing the query fails if the index is gone); PostgreSQL's planner has statistics and no such
#: clause, so its query text drops it.
_INDEXED_BY = re.compile(r" INDEXED BY \w+")


_AREAS: list[tuple[dict[str, str], dict[str, dict[str, str]]]] = []


def register(queries: dict[str, str], overrides: dict[str, dict[str, str]] | None = None) -> None:
    """Add an area's named queries (a store mixin module calls this at import). Names are unique."""
    clash = set(queries) & (set(QUERIES) | {k for q, _ in _AREAS for k in q})
    if clash:
        raise ValueError(f"query names registered twice: {sorted(clash)}")
    _AREAS.append((queries, overrides or {}))


def in_style(engine: str, text: str) -> str:
    """``text`` (``:name`` placeholders) in ``engine``'s placeholder style."""
    return _NAMED.sub(r"%(\1)s", text) if engine == "postgres" else text


def for_engine(engine: str) -> dict[str, str]:
    """The query set for ``engine`` (``sqlite`` or ``postgres``), placeholders in its style."""
    merged = {**QUERIES, **OVERRIDES.get(engine, {})}
    for area, area_overrides in _AREAS:
        merged.update(area)
        merged.update(area_overrides.get(engine, {}))
    if engine == "postgres":
        return {k: in_style(engine, _INDEXED_BY.sub("", v)) for k, v in merged.items()}
    return merged
