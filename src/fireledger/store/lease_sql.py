"""The SQL text of the multi-node timing plane's store operations (store/leases.py): sessions and
leases, the partition count, partition-restricted claims, the shadow rebuilder, rebuild and
repartition. Registered with :mod:`fireledger.store.queries` on import; PostgreSQL's overrides follow
the portable text.

Every lease write locks its rows in partition order — the multi-row ones through an ordered
``FOR UPDATE`` on PostgreSQL, the per-row ones because their callers iterate sorted — so the cycles
of several timing nodes never deadlock (decision 0262).
"""

from __future__ import annotations

from . import queries

_LEASE_COLS = ("partition, owner, epoch, rev, expires_us, eps_us, granted_us, renewed_us, released_us, "
               "prev_owner, handoff_to, takeover_us, takeover_cause")
_NODE_COLS = "id, role, started_us, heartbeat_us, eps_us, eps_source, shedding, stopped_us"
_SHADOW_COLS = ("partition, claimed_us, reported_us, node, triggers, live_rows, divergent, missing, orphaned, "
                "wrong_instant, wrong_version, wrong_partition, repartition_pending, duration_us")
_DIV_COLS = ("partition, trigger_id, kind, live_next_us, live_version, expected_next_us, expected_version, "
             "reported_us, node")
_SQLITE_PARTS = "SELECT value FROM json_each(:parts)"
_PG_PARTS = "SELECT CAST(jsonb_array_elements_text(CAST(:parts AS jsonb)) AS bigint)"
_DUE_COLS = "trigger_id, tenant_id, partition, next_us, version"

# One statement, so one snapshot on both engines: the trigger, its current version, the first
# version of the run of identical schedules that ends at it (when that schedule took effect), the
# resume point, the last scheduled instant the ledger decided (manual and backfill fires excluded:
# they do not move the recurrence), and the live due row.
_SHADOW_ROWS = (
    "SELECT t.id, t.tenant_id, t.state, t.current_version, t.partition, v.schedule, "
    "(SELECT MIN(v2.created_us) FROM trigger_versions v2 WHERE v2.trigger_id = t.id AND v2.version > "
    "  COALESCE((SELECT MAX(v3.version) FROM trigger_versions v3 WHERE v3.trigger_id = t.id "
    "            AND v3.schedule <> v.schedule), 0)), "
    "t.resumed_us, "
    "(SELECT MAX(f.scheduled_us) FROM fires f WHERE f.tenant_id = t.tenant_id AND f.trigger_id = t.id "
    "  AND f.kind IN ('scheduled', 'catch-up')), "
    "d.next_us, d.version, d.partition, t.paused_us "
    "FROM triggers t JOIN trigger_versions v ON v.trigger_id = t.id AND v.version = t.current_version "
    "LEFT JOIN due d ON d.trigger_id = t.id WHERE t.partition = :partition ORDER BY t.id"
)

LEASE_QUERIES: dict[str, str] = {
    # --- settings and rows ------------------------------------------------------------------------
    "tl_partitions_get": "SELECT value FROM timing_settings WHERE name = 'partitions'",
    "tl_partitions_set": "UPDATE timing_settings SET value = :n WHERE name = 'partitions'",
    "tl_ensure_leases": (
        "WITH RECURSIVE s(p) AS (SELECT 0 UNION ALL SELECT p + 1 FROM s WHERE p + 1 < :n) "
        "INSERT INTO leases (partition) SELECT p FROM s WHERE true ON CONFLICT (partition) DO NOTHING"
    ),
    "tl_trim_leases": "DELETE FROM leases WHERE partition >= :n",
    "tl_ensure_shadow": (
        "WITH RECURSIVE s(p) AS (SELECT 0 UNION ALL SELECT p + 1 FROM s WHERE p + 1 < :n) "
        "INSERT INTO shadow_partitions (partition) SELECT p FROM s WHERE true ON CONFLICT (partition) DO NOTHING"
    ),
    "tl_trim_shadow": "DELETE FROM shadow_partitions WHERE partition >= :n",
    "tl_trim_divergence": "DELETE FROM shadow_divergence WHERE partition >= :n",
    # --- sessions and leases ----------------------------------------------------------------------
    "tl_heartbeat": (
        "INSERT INTO nodes (id, role, started_us, heartbeat_us, eps_us, eps_source, shedding) "
        "VALUES (:id, :role, :started_us, :now_us, :eps_us, :eps_source, :shedding) "
        "ON CONFLICT (id) DO UPDATE SET heartbeat_us = excluded.heartbeat_us, eps_us = excluded.eps_us, "
        "eps_source = excluded.eps_source, shedding = excluded.shedding, stopped_us = NULL"
    ),
    "tl_renew": (
        "UPDATE leases SET expires_us = :expires_us, renewed_us = :now_us, rev = rev + 1 "
        "WHERE owner = :owner RETURNING partition, epoch"
    ),
    "tl_release_all": (
        "UPDATE leases SET owner = NULL, rev = rev + 1, released_us = :now_us, prev_owner = owner, "
        "handoff_to = NULL WHERE owner = :owner"
    ),
    "tl_release": (
        "UPDATE leases SET owner = NULL, rev = rev + 1, released_us = :now_us, prev_owner = owner, "
        "handoff_to = :handoff_to WHERE partition = :partition AND owner = :owner"
    ),
    "tl_grant": (
        "UPDATE leases SET owner = :owner, epoch = epoch + 1, rev = rev + 1, expires_us = :expires_us, "
        "eps_us = :eps_us, granted_us = :now_us, renewed_us = :now_us, prev_owner = COALESCE(owner, prev_owner), "
        "handoff_to = NULL, takeover_us = :takeover_us, takeover_cause = :cause "
        "WHERE partition = :partition AND rev = :rev"
    ),
    "tl_leases": f"SELECT {_LEASE_COLS} FROM leases ORDER BY partition",
    "tl_sessions": f"SELECT {_NODE_COLS} FROM nodes WHERE role = :role ORDER BY id",
    "tl_stop_node": "UPDATE nodes SET stopped_us = :now_us WHERE id = :id",
    "tl_prune_nodes": "DELETE FROM nodes WHERE role = :role AND heartbeat_us < :before_us",
    # --- claims restricted to partitions ----------------------------------------------------------
    "tl_due_rows_in": (
        f"SELECT {_DUE_COLS} FROM due WHERE next_us <= :until_us "
        f"AND (partition % :n) IN ({_SQLITE_PARTS}) ORDER BY next_us LIMIT :limit"
    ),
    "tl_earliest_due_in": f"SELECT MIN(next_us) FROM due WHERE (partition % :n) IN ({_SQLITE_PARTS})",
    # --- the shadow rebuilder ---------------------------------------------------------------------
    "tl_shadow_rows": _SHADOW_ROWS,
    "tl_shadow_strays": (
        "SELECT d.trigger_id, d.next_us, d.version FROM due d LEFT JOIN triggers t ON t.id = d.trigger_id "
        "WHERE d.partition = :partition AND t.id IS NULL ORDER BY d.trigger_id"
    ),
    "tl_shadow_stalest": (
        "SELECT partition, claimed_us FROM shadow_partitions WHERE partition < :n "
        "ORDER BY claimed_us, partition LIMIT 1"
    ),
    "tl_shadow_claim": (
        "UPDATE shadow_partitions SET claimed_us = :now_us, node = :node "
        "WHERE partition = :partition AND claimed_us = :seen"
    ),
    "tl_shadow_report": (
        "INSERT INTO shadow_partitions (partition, claimed_us, reported_us, node, triggers, live_rows, divergent, "
        "missing, orphaned, wrong_instant, wrong_version, wrong_partition, repartition_pending, duration_us) "
        "VALUES (:partition, :now_us, :now_us, :node, :triggers, :live_rows, :divergent, :missing, :orphaned, "
        ":wrong_instant, :wrong_version, :wrong_partition, :repartition_pending, :duration_us) "
        "ON CONFLICT (partition) DO UPDATE SET reported_us = excluded.reported_us, node = excluded.node, "
        "triggers = excluded.triggers, live_rows = excluded.live_rows, divergent = excluded.divergent, "
        "missing = excluded.missing, orphaned = excluded.orphaned, wrong_instant = excluded.wrong_instant, "
        "wrong_version = excluded.wrong_version, wrong_partition = excluded.wrong_partition, "
        "repartition_pending = excluded.repartition_pending, duration_us = excluded.duration_us"
    ),
    "tl_shadow_clear": "DELETE FROM shadow_divergence WHERE partition = :partition",
    "tl_shadow_insert": (
        f"INSERT INTO shadow_divergence ({_DIV_COLS}) VALUES (:partition, :trigger_id, :kind, :live_next_us, "
        ":live_version, :expected_next_us, :expected_version, :reported_us, :node) "
        "ON CONFLICT (partition, trigger_id) DO NOTHING"
    ),
    "tl_shadow_reports": f"SELECT {_SHADOW_COLS} FROM shadow_partitions ORDER BY partition",
    "tl_shadow_divergences": f"SELECT {_DIV_COLS} FROM shadow_divergence ORDER BY partition, trigger_id",
    "tl_out_of_range": "SELECT COUNT(*) FROM triggers WHERE partition >= :n",
    "tl_count_triggers": "SELECT COUNT(*) FROM triggers",
    "tl_out_of_range_partitions": "SELECT DISTINCT partition FROM triggers WHERE partition >= :n ORDER BY partition",
    # --- rebuild and repartition ------------------------------------------------------------------
    "tl_rebuild_lock": (
        "SELECT d.trigger_id FROM due d WHERE d.partition = :partition "
        "OR d.trigger_id IN (SELECT id FROM triggers WHERE partition = :partition) ORDER BY d.trigger_id"
    ),
    "tl_rebuild_clear_partition": "DELETE FROM due WHERE partition = :partition",
    "tl_rebuild_clear_triggers": (
        "DELETE FROM due WHERE trigger_id IN (SELECT id FROM triggers WHERE partition = :partition)"
    ),
    "tl_rebuild_insert": (
        f"INSERT INTO due ({_DUE_COLS}) VALUES (:trigger_id, :tenant_id, :partition, :next_us, :version)"
    ),
    "tl_delete_orphans": "DELETE FROM due WHERE trigger_id NOT IN (SELECT id FROM triggers)",
    "tl_trigger_partitions": "SELECT id, partition FROM triggers WHERE id > :after ORDER BY id LIMIT :limit",
    "tl_set_trigger_partition": "UPDATE triggers SET partition = :partition WHERE id = :id",
    "tl_set_due_partition": "UPDATE due SET partition = :partition WHERE trigger_id = :id",
    "tl_due_index": f"SELECT {_DUE_COLS} FROM due ORDER BY trigger_id",
}

LEASE_OVERRIDES: dict[str, dict[str, str]] = {
    "postgres": {
        "tl_due_rows_in": (
            f"SELECT {_DUE_COLS} FROM due WHERE next_us <= :until_us "
            f"AND mod(partition, :n) IN ({_PG_PARTS}) ORDER BY next_us LIMIT :limit"
        ),
        "tl_earliest_due_in": f"SELECT MIN(next_us) FROM due WHERE mod(partition, :n) IN ({_PG_PARTS})",
        # A multi-row lease write locks its rows in partition order, like grants and releases (one
        # row each, in that order): two nodes' cycles never deadlock (decision 0262).
        "tl_renew": (
            "UPDATE leases l SET expires_us = :expires_us, renewed_us = :now_us, rev = l.rev + 1 "
            "FROM (SELECT partition FROM leases WHERE owner = :owner ORDER BY partition FOR UPDATE) o "
            "WHERE l.partition = o.partition AND l.owner = :owner RETURNING l.partition, l.epoch"
        ),
        "tl_release_all": (
            "UPDATE leases l SET owner = NULL, rev = l.rev + 1, released_us = :now_us, prev_owner = l.owner, "
            "handoff_to = NULL "
            "FROM (SELECT partition FROM leases WHERE owner = :owner ORDER BY partition FOR UPDATE) o "
            "WHERE l.partition = o.partition AND l.owner = :owner"
        ),
        # Rows a decision could move are locked first, so the snapshot that follows sees every
        # advance committed before it and none can commit against the rows until this one does.
        "tl_rebuild_lock": (
            "SELECT d.trigger_id FROM due d WHERE d.partition = :partition "
            "OR d.trigger_id IN (SELECT id FROM triggers WHERE partition = :partition) "
            "ORDER BY d.trigger_id FOR UPDATE OF d"
        ),
    },
}

queries.register(LEASE_QUERIES, LEASE_OVERRIDES)
