"""The dispatch plane's store operations (their SQL text; the methods are :mod:`fireledger.store.dispatch`).

* :meth:`SqlDispatch.claim_shaped` — one claim transaction for all lanes: a bounded batch of
  each lane's due fires, read from an index in order (:mod:`.claim_sql`, decision 0130: what a claim
  reads does not grow with the backlog), in fair order (oldest first within a trigger, round-robin
  across a tenant's triggers and across tenants, held tenants last), locked with ``FOR UPDATE SKIP
  LOCKED`` on PostgreSQL so any number of dispatch processes share the lanes without
  double-claiming (SQLite has one writer); then the rate buckets those fires need
  (locked in key order, so concurrent claims never deadlock), the tenants' quotas and their attempts
  in flight in every process; a caller-supplied *shaper* (``fireledger.dispatch.shaping``) decides;
  the store leases the admitted fires, records their attempts and the new bucket states, and commits.
* :meth:`SqlDispatch.settle_dispatch` — finish attempts and settle fires (compare-and-set on
  the lease), and for a ``queue`` target put the delivered fire on the tenant's queue in the same
  transaction.
* Queues (``queue_pull``, ``queue_ack``, ``queue_stats``): at-least-once, a visibility timeout,
  ack by fire key. A message references its fire; the payload is read from the registry at pull.
* Outcomes (``record_outcome``, ``get_outcome``, ``outcome_context``): ``work_outcomes`` holds
  ``succeeded`` / ``failed``; no row is ``unknown``. Signed callbacks are replay-guarded by their
  ``webhook-id`` (``callback_receipts``).
* Tenant quotas (``tenant_quota``, ``set_tenant_quota``): the tenants table's columns.

Lists of ids are bound as one JSON array parameter (``json_each`` on SQLite,
``jsonb_array_elements`` on PostgreSQL), so every statement has a fixed text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from . import queries

log = logging.getLogger("fireledger.store")

_F = queries.FIRE_COLS
_FF = ", ".join("f." + c.strip() for c in _F.split(","))
_TARGET_COLS = "id, tenant_id, kind, url, secret, verification_state, verification_token, created_us"
_V_COLS = ("v.trigger_id, v.version, v.tenant_id, v.schedule, v.target_id, v.payload, v.policies, "
           "v.tzdata_version, v.created_us")

_SQLITE_IDS = "SELECT value FROM json_each(:ids)"
_PG_IDS = "SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))"

DISPATCH_QUERIES: dict[str, str] = {
    "dp_bucket_seed": (
        "INSERT INTO rate_buckets (key, tat_us) SELECT value, 0 FROM json_each(:ids) WHERE true "
        "ORDER BY value ON CONFLICT DO NOTHING"
    ),
    "dp_bucket_lock": f"SELECT key, tat_us FROM rate_buckets WHERE key IN ({_SQLITE_IDS}) ORDER BY key",
    "dp_bucket_set": "UPDATE rate_buckets SET tat_us = :tat_us WHERE key = :key",
    "dp_quotas": (
        "SELECT id, quota_fires_per_s, quota_inflight, catchup_fraction FROM tenants "
        f"WHERE id IN ({_SQLITE_IDS})"
    ),
    "dp_inflight": (
        "SELECT tenant_id, COUNT(*) FROM fires WHERE state = 'dispatching' AND next_attempt_us > :now_us "
        f"AND tenant_id IN ({_SQLITE_IDS}) GROUP BY tenant_id"
    ),
    "dp_versions": (
        f"SELECT {_V_COLS} FROM json_each(:ids) j JOIN trigger_versions v "
        "ON v.trigger_id = json_extract(j.value, '$[0]') AND v.version = json_extract(j.value, '$[1]')"
    ),
    "dp_targets": f"SELECT {_TARGET_COLS} FROM targets WHERE id IN ({_SQLITE_IDS})",
    # Leased by primary key. The guards are written so no index can serve them (``state || ''``,
    # ``next_attempt_us + 0``): with a fresh fires table PostgreSQL's generic plan otherwise walked a
    # partial index over the whole due backlog (or every fire of the instant) for each lease —
    # 256 leases took 2 s at 20,000 due fires (decision 0130).
    "dp_lease": (
        "UPDATE fires SET state = 'dispatching', lease_owner = :owner, next_attempt_us = :until_us, "
        "attempts = attempts + 1, dispatched_us = COALESCE(dispatched_us, :now_us) "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq AND state || '' IN ('pending', 'dispatching') AND next_attempt_us + 0 <= :now_us"
    ),
    # The attempt a lapsed lease left open: no result was recorded (the runner stopped or lost the store).
    "dp_attempt_lapsed": (
        "UPDATE attempts SET finished_us = :now_us, result = 'unknown', "
        "error = 'lease lapsed: no result recorded' WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq AND attempt = :attempt AND finished_us IS NULL"
    ),
    # A fire whose attempts are used up when it comes round again is settled, never leased again.
    "dp_exhausted": (
        "UPDATE fires SET state = :state, cause = CASE WHEN cause IS NULL THEN CAST(:cause AS TEXT) "
        "ELSE CAST(:cause AS TEXT) || '; ' || cause END, finished_us = :now_us, lease_owner = NULL, "
        "next_attempt_us = NULL "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq AND state || '' IN ('pending', 'dispatching') AND next_attempt_us + 0 <= :now_us "
        "AND attempts = :attempts"   # guards as in dp_lease: by primary key only
    ),
    "dp_attempt": (
        "INSERT INTO attempts (tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, node) "
        "VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :attempt, :now_us, :owner) "
        "ON CONFLICT DO NOTHING"
    ),
    "dp_enqueue": (
        "INSERT INTO queue_messages (tenant_id, trigger_id, scheduled_us, seq, target_id, enqueued_us, "
        "visible_us, receives) VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :target_id, :now_us, "
        ":now_us, 0) ON CONFLICT DO NOTHING"
    ),
    "dp_queue_pick": (
        f"SELECT m.tenant_id, m.trigger_id, m.scheduled_us, m.seq, m.receives, {_FF}, v.payload "
        "FROM queue_messages m JOIN fires f ON f.tenant_id = m.tenant_id AND f.trigger_id = m.trigger_id "
        "AND f.scheduled_us = m.scheduled_us AND f.seq = m.seq "
        "JOIN trigger_versions v ON v.trigger_id = f.trigger_id AND v.version = f.version "
        "WHERE m.target_id = :target_id AND m.tenant_id = :tenant_id AND m.visible_us <= :now_us "
        "ORDER BY m.scheduled_us, m.trigger_id, m.seq LIMIT :limit"
    ),
    "dp_queue_hide": (
        "UPDATE queue_messages SET visible_us = :visible_us, receives = receives + 1 "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq"
    ),
    "dp_queue_ack": (
        "DELETE FROM queue_messages WHERE target_id = :target_id AND tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "dp_queue_stats": (
        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN visible_us <= :now_us THEN 1 ELSE 0 END), 0), "
        "MIN(scheduled_us) FROM queue_messages WHERE target_id = :target_id AND tenant_id = :tenant_id"
    ),
    "dp_outcome_context": (
        f"SELECT {_FF}, t.id, t.tenant_id, t.kind, t.url, t.secret, t.verification_state, "
        "t.verification_token, t.created_us FROM fires f "
        "JOIN trigger_versions v ON v.trigger_id = f.trigger_id AND v.version = f.version "
        "JOIN targets t ON t.id = v.target_id "
        "WHERE f.tenant_id = :tenant_id AND f.trigger_id = :trigger_id AND f.scheduled_us = :scheduled_us "
        "AND f.seq = :seq AND t.tenant_id = :tenant_id"
    ),
    "dp_receipts_purge": "DELETE FROM callback_receipts WHERE seen_us < :before_us",
    "dp_receipt": (
        "INSERT INTO callback_receipts (target_id, msg_id, seen_us) VALUES (:target_id, :msg_id, :now_us) "
        "ON CONFLICT DO NOTHING"
    ),
    "dp_outcome_insert": (
        "INSERT INTO work_outcomes (tenant_id, trigger_id, scheduled_us, seq, outcome, reported_us) "
        "VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :outcome, :now_us) ON CONFLICT DO NOTHING"
    ),
    "dp_outcome_get": (
        "SELECT outcome, reported_us FROM work_outcomes WHERE tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "dp_quota_get": (
        "SELECT quota_fires_per_s, quota_inflight, catchup_fraction FROM tenants WHERE id = :id "
        "AND deleted_us IS NULL"
    ),
    "dp_quota_set": (
        "UPDATE tenants SET quota_fires_per_s = :fires_per_s, quota_inflight = :inflight, "
        "catchup_fraction = :catchup_fraction WHERE id = :id AND deleted_us IS NULL"
    ),
}

_PG_OVERRIDES: dict[str, str] = {
    "dp_bucket_seed": (
        "INSERT INTO rate_buckets (key, tat_us) SELECT k, 0 FROM jsonb_array_elements_text(CAST(:ids AS jsonb)) "
        "AS k ORDER BY k ON CONFLICT DO NOTHING"
    ),
    "dp_bucket_lock": f"SELECT key, tat_us FROM rate_buckets WHERE key IN ({_PG_IDS}) ORDER BY key FOR UPDATE",
    "dp_quotas": (
        "SELECT id, quota_fires_per_s, quota_inflight, catchup_fraction FROM tenants "
        f"WHERE id IN ({_PG_IDS})"
    ),
    "dp_inflight": (
        "SELECT tenant_id, COUNT(*) FROM fires WHERE state = 'dispatching' AND next_attempt_us > :now_us "
        f"AND tenant_id IN ({_PG_IDS}) GROUP BY tenant_id"
    ),
    "dp_versions": (
        f"SELECT {_V_COLS} FROM jsonb_array_elements(CAST(:ids AS jsonb)) j JOIN trigger_versions v "
        "ON v.trigger_id = j->>0 AND v.version = CAST(j->>1 AS bigint)"
    ),
    "dp_targets": f"SELECT {_TARGET_COLS} FROM targets WHERE id IN ({_PG_IDS})",
    "dp_queue_pick": DISPATCH_QUERIES["dp_queue_pick"] + " FOR UPDATE OF m SKIP LOCKED",
}

queries.register(DISPATCH_QUERIES, {"postgres": _PG_OVERRIDES})


def _ids(values: Sequence[str] | set[str]) -> str:
    return json.dumps(sorted(values))


__all__ = ["DISPATCH_QUERIES"]
