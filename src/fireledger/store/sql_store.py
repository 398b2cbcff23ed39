"""The Store: one implementation over two engines (SQLite, PostgreSQL), one contract suite.

Every method that writes takes ``now_us`` from the caller: the store never reads a clock. Claims are
compare-and-set: zero rows updated is a normal outcome ("decided elsewhere"), more than one is a bug
and raises :class:`InvariantViolation` (rolling the transaction back).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from fireledger.domain.keys import FireKey
from fireledger.domain.model import (
    Advance,
    Attempt,
    ClaimOutcome,
    Decision,
    DispatchJob,
    DueRow,
    Fire,
    FireState,
    MissedFirePolicy,
    NewFire,
    OverlapPolicy,
    Policies,
    Principal,
    Target,
    Tenant,
    Trigger,
    TriggerState,
    TriggerVersion,
)

from .backfill import BackfillMixin
from .console import ConsoleMixin
from .dispatching import DispatchingMixin
from .engine import Engine, SchemaError, SqliteEngine, StoreError, engine_for_url, migration_files
from .gaps import GapsMixin
from .history import HistoryMixin
from .leases import LeasesMixin
from .overlap import OverlapMixin
from .reports import ReportsMixin
from .trust import AUDIT_KEYED_MIGRATION, AuditNote, TrustMixin


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of one attempt: its result and what becomes of the fire."""

    job: DispatchJob
    result: str
    http_status: int | None
    error: str | None
    state: str
    cause: str | None
    next_attempt_us: int | None


class InvariantViolation(StoreError):
    """A compare-and-set matched more than one row: a bug, never a normal outcome."""


def _one(rowcount: int, what: str) -> bool:
    if rowcount > 1:
        raise InvariantViolation(f"{what} matched {rowcount} rows")
    return rowcount == 1


@lru_cache(maxsize=1024)
def policies_to_json(p: Policies) -> str:
    """Encode policies (immutable values, few distinct ones: cached, which bulk creates rely on)."""
    return json.dumps(asdict(p), sort_keys=True)


_POLICIES: dict[str, Policies] = {}


def policies_from_json(text: str) -> Policies:
    """Decode stored policies. Policies are immutable values and most versions share a few distinct
    texts, so decoded values are shared (a bounded cache: a burst of new triggers is not a burst of
    JSON decoding)."""
    found = _POLICIES.get(text)
    if found is not None:
        return found
    d = json.loads(text)
    d["missed_fire"] = MissedFirePolicy(d["missed_fire"])
    d["overlap"] = OverlapPolicy(d["overlap"])
    p = Policies(**d)
    if len(_POLICIES) >= 10_000:
        _POLICIES.clear()
    _POLICIES[text] = p
    return p


def _fire(row: Sequence[Any]) -> Fire:
    return Fire(*row)


def _target(row: Sequence[Any]) -> Target:
    return Target(*row)


def _trigger(row: Sequence[Any]) -> Trigger:
    return Trigger(row[0], row[1], row[2], TriggerState(row[3]), row[4], row[5], row[6], row[7], row[8],
                   row[9] if len(row) > 9 else None)


def _version(row: Sequence[Any]) -> TriggerVersion:
    return TriggerVersion(
        trigger_id=row[0], version=row[1], tenant_id=row[2], schedule=json.loads(row[3]),
        target_id=row[4], payload=bytes(row[5]), policies=policies_from_json(row[6]),
        tzdata_version=row[7], created_us=row[8],
    )


class SqlStore(HistoryMixin, TrustMixin, DispatchingMixin, LeasesMixin, BackfillMixin, ReportsMixin,
               OverlapMixin, GapsMixin, ConsoleMixin):
    """The state of record. Thread-safe: each thread uses its own connection."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.q = engine.q

    @classmethod
    def open(cls, url: str, *, migrate: bool | None = None) -> SqlStore:
        """Open the store at ``url``. SQLite migrates on first use; PostgreSQL only checks the schema
        (``fireledger db upgrade`` migrates) unless ``migrate=True``."""
        store = cls(engine_for_url(url))
        do_migrate = isinstance(store.engine, SqliteEngine) if migrate is None else migrate
        if do_migrate:
            store.migrate()
        else:
            store.check_schema()
        return store

    @property
    def engine_name(self) -> str:
        return str(self.engine.name)

    def close(self) -> None:
        self.engine.close()

    # --- schema ---------------------------------------------------------------------------------

    def applied_migrations(self) -> set[int]:
        """Versions recorded in ``schema_migrations`` (empty for a fresh database)."""
        with self.engine.read() as c:
            try:
                rows = c.execute("SELECT version FROM schema_migrations").fetchall()
            except Exception:
                return set()
        return {int(r[0]) for r in rows}

    def schema_version(self) -> int:
        return max(self.applied_migrations(), default=0)

    def migrate(self, now_us: int = 0) -> list[int]:
        """Apply every missing migration, each in its own transaction; returns those applied."""
        applied = []
        with self.engine.write() as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_us BIGINT)"
            )
        done = self.applied_migrations()
        for version, sql in migration_files(self.engine.name):
            if version in done:
                continue
            with self.engine.write() as c:
                if self.engine.name == "sqlite":
                    for stmt in _split(sql):
                        c.execute(stmt)
                else:
                    c.execute("SET LOCAL statement_timeout = 0")   # a migration may rewrite a big table
                    c.execute(sql)
                if version == AUDIT_KEYED_MIGRATION:
                    self._seal_legacy_audit(c, now_us)   # unkeyed rows sealed by a keyed row (0090)
                c.execute("INSERT INTO schema_migrations (version, applied_us) VALUES (:v, :n)"
                          if self.engine.name == "sqlite" else
                          "INSERT INTO schema_migrations (version, applied_us) VALUES (%(v)s, %(n)s)",
                          {"v": version, "n": now_us})
            applied.append(version)
        return applied

    def check_schema(self) -> None:
        """Raise :class:`SchemaError` unless the database is at this program's schema version."""
        files = [v for v, _ in migration_files(self.engine.name)]
        want = files[-1]
        have = self.schema_version()
        missing = sorted(set(files) - self.applied_migrations())
        if missing and have <= want:
            have = missing[0] - 1
        if have < want:
            raise SchemaError(
                f"the database schema is at version {have}, this program needs {want}: "
                "run `fireledger db upgrade --db URL` first"
            )
        if have > want:
            raise SchemaError(f"the database schema ({have}) is newer than this program ({want})")

    # --- tenants and principals -----------------------------------------------------------------

    def create_tenant(self, tenant: Tenant) -> None:
        with self.engine.write() as c:
            c.execute(self.q["insert_tenant"], {"id": tenant.id, "name": tenant.name,
                                                "created_us": tenant.created_us})

    def create_tenant_with_principal(self, tenant: Tenant, principal: Principal, token_hash: str) -> None:
        with self.engine.write() as c:
            c.execute(self.q["insert_tenant"], {"id": tenant.id, "name": tenant.name,
                                                "created_us": tenant.created_us})
            self._insert_principal(c, principal, token_hash)

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        with self.engine.read() as c:
            row = c.execute(self.q["get_tenant"], {"id": tenant_id}).fetchone()
        return Tenant(*row) if row else None

    def _insert_principal(self, c: Any, p: Principal, token_hash: str) -> None:
        c.execute(self.q["insert_principal"], {
            "id": p.id, "tenant_id": p.tenant_id, "name": p.name, "token_hash": token_hash,
            "roles": ",".join(sorted(p.roles)), "created_us": p.created_us})

    def create_principal(self, principal: Principal, token_hash: str) -> None:
        with self.engine.write() as c:
            self._insert_principal(c, principal, token_hash)

    def principal_by_token_hash(self, token_hash: str) -> Principal | None:
        with self.engine.read() as c:
            row = c.execute(self.q["principal_by_token_hash"], {"token_hash": token_hash}).fetchone()
        if not row:
            return None
        return Principal(row[0], row[1], row[2], frozenset(filter(None, row[3].split(","))), row[4], row[5])

    # --- targets --------------------------------------------------------------------------------

    def sealed_secret(self, t: Target) -> str:
        """``t.secret`` in its stored form: sealed under the tenant's data key (a plaintext
        ``whsec_`` secret is sealed here; anything else that is not sealed is refused), so no write
        stores a signing secret in plaintext (fireledger.security.envelope)."""
        from fireledger.security.envelope import is_sealed_secret, seal_secret

        if is_sealed_secret(t.secret):
            return t.secret
        if not t.secret.startswith("whsec_"):
            raise ValueError("secret: a target's signing secret must be a whsec_ secret or sealed")
        return seal_secret(self, t.tenant_id, t.id, t.secret)

    def unsealed_target_secrets(self, after: str, limit: int) -> list[tuple[str, str, str]]:
        """``(target id, tenant id, secret)`` of rows whose secret is still plaintext, by id after ``after``."""
        with self.engine.read() as c:
            rows = c.execute(self.q["unsealed_target_secrets"], {"after": after, "limit": limit}).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def replace_target_secret(self, target_id: str, old: str, new: str) -> bool:
        """Compare-and-set a target's stored secret; True when this call changed it."""
        with self.engine.write() as c:
            cur = c.execute(self.q["replace_target_secret"], {"id": target_id, "old": old, "new": new})
            return bool(cur.rowcount)

    def create_target(self, t: Target) -> None:
        secret = self.sealed_secret(t)
        with self.engine.write() as c:
            c.execute(self.q["insert_target"], {
                "id": t.id, "tenant_id": t.tenant_id, "kind": t.kind, "url": t.url, "secret": secret,
                "verification_state": t.verification_state, "verification_token": t.verification_token,
                "created_us": t.created_us})

    def get_target(self, tenant_id: str, target_id: str) -> Target | None:
        with self.engine.read() as c:
            row = c.execute(self.q["get_target"], {"tenant_id": tenant_id, "id": target_id}).fetchone()
        return _target(row) if row else None

    def list_targets(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Target]:
        with self.engine.read() as c:
            rows = c.execute(self.q["list_targets"],
                             {"tenant_id": tenant_id, "after": after, "limit": limit}).fetchall()
        return [_target(r) for r in rows]

    def delete_target(self, tenant_id: str, target_id: str, now_us: int) -> bool:
        """Soft-delete a target. Refused (``StoreError``) while a live trigger points at it."""
        with self.engine.write() as c:
            used = c.execute(self.q["target_in_use"], {"tenant_id": tenant_id, "target_id": target_id}).fetchone()
            if used:
                raise StoreError(f"target {target_id} is used by trigger {used[0]}")
            return _one(c.execute(self.q["delete_target"], {"tenant_id": tenant_id, "id": target_id,
                                                            "now_us": now_us}).rowcount, "delete_target")

    # --- triggers -------------------------------------------------------------------------------

    def _version_params(self, v: TriggerVersion) -> dict[str, Any]:
        return {"trigger_id": v.trigger_id, "version": v.version, "tenant_id": v.tenant_id,
                "schedule": json.dumps(v.schedule, sort_keys=True), "target_id": v.target_id,
                "payload": v.payload, "policies": policies_to_json(v.policies),
                "tzdata_version": v.tzdata_version, "created_us": v.created_us}

    def _trigger_params(self, trigger: Trigger, version: TriggerVersion) -> dict[str, Any]:
        return {"id": trigger.id, "tenant_id": trigger.tenant_id, "name": trigger.name,
                "state": trigger.state.value, "current_version": version.version,
                "partition": trigger.partition, "created_us": trigger.created_us,
                "updated_us": trigger.updated_us}

    @staticmethod
    def _due_params(trigger: Trigger, version: TriggerVersion, next_us: int) -> dict[str, Any]:
        return {"trigger_id": trigger.id, "tenant_id": trigger.tenant_id, "partition": trigger.partition,
                "next_us": next_us, "version": version.version}

    def create_trigger(self, trigger: Trigger, version: TriggerVersion, next_us: int | None, *,
                       audit: AuditNote | None = None) -> None:
        """Insert the trigger, its first version, (when ``next_us`` and active) its due row and (when
        given) the ``audit`` row, in one transaction: none of them exists without the others."""
        with self.engine.write() as c:
            c.execute(self.q["insert_trigger"], self._trigger_params(trigger, version))
            c.execute(self.q["insert_version"], self._version_params(version))
            if next_us is not None and trigger.state == TriggerState.ACTIVE:
                c.execute(self.q["upsert_due"], self._due_params(trigger, version, next_us))
            if audit is not None:
                self._append_note(c, audit)
            c.execute(self.q["bump_definitions"])

    def create_triggers(self, items: Sequence[tuple[Trigger, TriggerVersion, int | None]],
                        audits: Sequence[AuditNote] = ()) -> None:
        """:meth:`create_trigger` for many triggers (and any ``audits``) in ONE transaction, the rows
        written with ``executemany`` (bulk loading: the benchmarks and falsification harnesses).
        All or nothing: a failing row or audit row leaves none of them."""
        if not items and not audits:
            return
        with self.engine.write() as c:
            cur = c.cursor()
            cur.executemany(self.q["insert_trigger"], [self._trigger_params(t, v) for t, v, _ in items])
            cur.executemany(self.q["insert_version"], [self._version_params(v) for _, v, _ in items])
            due = [self._due_params(t, v, n) for t, v, n in items
                   if n is not None and t.state == TriggerState.ACTIVE]
            if due:
                cur.executemany(self.q["upsert_due"], due)
            for note in audits:
                self._append_note(c, note)
            c.execute(self.q["bump_definitions"])

    def get_trigger(self, tenant_id: str, trigger_id: str) -> Trigger | None:
        with self.engine.read() as c:
            row = c.execute(self.q["get_trigger"], {"tenant_id": tenant_id, "id": trigger_id}).fetchone()
        return _trigger(row) if row else None

    def list_triggers(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Trigger]:
        with self.engine.read() as c:
            rows = c.execute(self.q["list_triggers"],
                             {"tenant_id": tenant_id, "after": after, "limit": limit}).fetchall()
        return [_trigger(r) for r in rows]

    def get_version(self, trigger_id: str, version: int) -> TriggerVersion | None:
        with self.engine.read() as c:
            row = c.execute(self.q["get_version"], {"trigger_id": trigger_id, "version": version}).fetchone()
        return _version(row) if row else None

    def get_versions(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], TriggerVersion]:
        """Many versions in one statement, keyed by (trigger_id, version); missing ones are absent."""
        if not pairs:
            return {}
        with self.engine.read() as c:
            rows = c.execute(self.q["dp_versions"], {"ids": json.dumps(sorted(set(pairs)))}).fetchall()
        out = {}
        for row in rows:
            v = _version(row)
            out[(v.trigger_id, v.version)] = v
        return out

    def amend_trigger(self, trigger: Trigger, new_version: TriggerVersion, name: str,
                      next_us: int | None, now_us: int, *, audit: AuditNote | None = None) -> bool:
        """Make ``new_version`` current, recompute the due row and (when given) append the ``audit``
        row, in one transaction.

        Compare-and-set on the trigger's current version: False when it moved meanwhile (nothing
        written, no audit row).
        """
        with self.engine.write() as c:
            ok = _one(c.execute(self.q["update_trigger_version"], {
                "new_version": new_version.version, "name": name, "now_us": now_us,
                "tenant_id": trigger.tenant_id, "id": trigger.id,
                "expected_version": trigger.current_version}).rowcount, "amend_trigger")
            if not ok:
                return False
            c.execute(self.q["insert_version"], self._version_params(new_version))
            self._set_due(c, trigger, next_us if trigger.state == TriggerState.ACTIVE else None,
                          new_version.version)
            if audit is not None:
                self._append_note(c, audit)
            c.execute(self.q["bump_definitions"])
        return True

    def _set_due(self, c: Any, trigger: Trigger, next_us: int | None, version: int) -> None:
        if next_us is None:
            c.execute(self.q["delete_due"], {"trigger_id": trigger.id})
        else:
            c.execute(self.q["upsert_due"], {"trigger_id": trigger.id, "tenant_id": trigger.tenant_id,
                                             "partition": trigger.partition, "next_us": next_us,
                                             "version": version})

    def set_trigger_state(self, trigger: Trigger, state: TriggerState, next_us: int | None,
                          now_us: int) -> bool:
        """Pause / resume / delete: CAS on the current state, due row set or removed atomically."""
        with self.engine.write() as c:
            ok = _one(c.execute(self.q["update_trigger_state"], {
                "state": state.value, "now_us": now_us, "tenant_id": trigger.tenant_id,
                "id": trigger.id, "expected_state": trigger.state.value}).rowcount, "set_trigger_state")
            if not ok:
                return False
            self._set_due(c, trigger, next_us if state == TriggerState.ACTIVE else None,
                          trigger.current_version)
            c.execute(self.q["bump_definitions"])
        return True

    def definitions_counter(self) -> int:
        """A counter bumped by every definition change (wakes timing loops in other processes)."""
        with self.engine.read() as c:
            row = c.execute(self.q["definitions_counter"]).fetchone()
        return int(row[0]) if row else 0

    # --- timing ---------------------------------------------------------------------------------

    def due_rows(self, until_us: int, limit: int) -> list[DueRow]:
        """Due-index rows with ``next_us <= until_us``, earliest first."""
        with self.engine.read() as c:
            rows = c.execute(self.q["due_rows"], {"until_us": until_us, "limit": limit}).fetchall()
        return [DueRow(*r) for r in rows]

    def earliest_due(self) -> int | None:
        with self.engine.read() as c:
            row = c.execute(self.q["earliest_due"]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def apply_decisions(self, decisions: Sequence[Decision]) -> list[ClaimOutcome]:
        """Commit fires and due-row advances in ONE transaction.

        For each decision: insert its fires (a primary-key conflict inserts nothing: decided
        elsewhere), then compare-and-set the due row. When the CAS finds the row moved (another
        decider, or an amendment/pause committed meanwhile) the fires this call inserted for it are
        removed again, so nothing is decided against a definition no longer in force.
        """
        q = self.q
        outcomes: list[ClaimOutcome] = []
        if not decisions:
            return outcomes
        with self.engine.write() as c:
            fast = self._apply_all_or_nothing(c, decisions)
            if fast is not None:
                for d in decisions:
                    if d.updates:   # overlap: a held fire superseded (every row advanced here)
                        self._apply_fire_updates(c, d.updates)
                return fast
            for d in decisions:
                inserted = []
                for f in d.fires:
                    n = c.execute(q["insert_fire"], _fire_params(f)).rowcount
                    if _one(n, "insert_fire"):
                        inserted.append(f)
                a = d.advance
                params = _advance_params(a)
                if a.new_next_us is None:
                    advanced = _one(c.execute(q["retire_due"], params).rowcount, "retire_due")
                else:
                    advanced = _one(c.execute(q["advance_due"], params).rowcount, "advance_due")
                if not advanced and inserted:
                    for f in inserted:
                        c.execute(q["delete_fire"], {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                                                     "scheduled_us": f.scheduled_us, "seq": f.seq})
                    inserted = []
                if advanced and d.updates:   # overlap: a held fire superseded, only with its decision
                    self._apply_fire_updates(c, d.updates)
                outcomes.append(ClaimOutcome(a.trigger_id, advanced, tuple(inserted)))
        return outcomes

    def _apply_all_or_nothing(self, c: Any, decisions: Sequence[Decision]) -> list[ClaimOutcome] | None:
        """The common case in bulk: every fire is new and every due row is where the decision
        expects it. Three batched statements inside a savepoint; when any count differs (a fire
        decided elsewhere, a row moved) the savepoint is rolled back and None returned, and the
        caller decides row by row. Counts are exact: each statement matches at most its own row
        (primary key), so a total equal to the number of statements means each matched once."""
        q = self.q
        fires = [f for d in decisions for f in d.fires]
        advances = [d.advance for d in decisions if d.advance.new_next_us is not None]
        retires = [d.advance for d in decisions if d.advance.new_next_us is None]
        cur = c.cursor()
        cur.execute("SAVEPOINT apply_bulk")
        ok = True
        for sql, params in ((q["insert_fire"], [_fire_params(f) for f in fires]),
                            (q["advance_due"], [_advance_params(a) for a in advances]),
                            (q["retire_due"], [_advance_params(a) for a in retires])):
            if not params:
                continue
            cur.executemany(sql, params)
            if cur.rowcount != len(params):
                ok = False
                break
        if not ok:
            cur.execute("ROLLBACK TO SAVEPOINT apply_bulk")
            cur.execute("RELEASE SAVEPOINT apply_bulk")
            return None
        cur.execute("RELEASE SAVEPOINT apply_bulk")
        return [ClaimOutcome(d.advance.trigger_id, True, tuple(d.fires)) for d in decisions]

    def insert_fires(self, fires: Sequence[NewFire], *, audit: AuditNote | None = None) -> list[NewFire]:
        """Commit fires that advance no due row (manual runs) in one transaction; returns those
        inserted — a fire whose key exists already inserts nothing (decided elsewhere). ``audit`` is
        appended in the same transaction when at least one fire was inserted (none: no audit row)."""
        inserted = []
        with self.engine.write() as c:
            for f in fires:
                n = c.execute(self.q["insert_fire"], {
                    "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
                    "seq": f.seq, "version": f.version, "kind": f.kind.value, "lane": f.lane.value,
                    "state": f.state.value, "cause": f.cause, "decided_us": f.decided_us,
                    "decided_by": f.decided_by, "finished_us": None, "tzdata_version": f.tzdata_version,
                    "next_attempt_us": f.not_before_us if f.not_before_us is not None else f.decided_us,
                    "eps_us": f.eps_us, "eps_source": f.eps_source,
                }).rowcount
                if _one(n, "insert_fire"):
                    inserted.append(f)
            if audit is not None and inserted:
                self._append_note(c, audit)
        return inserted

    # --- dispatch -------------------------------------------------------------------------------

    def claim_dispatch(self, lane: str, now_us: int, limit: int, owner: str,
                       lease_us: int, lease_margin_us: int = 0) -> list[DispatchJob]:
        """Lease up to ``limit`` dispatchable fires of ``lane`` (pending, or dispatching with an
        expired lease) to ``owner`` until ``now_us + lease_us``; records each attempt as started.
        With ``lease_margin_us``, each lease is then fitted to its own attempt deadline
        (``timeout + margin``), so a killed runner's fires return to the lane soon after.

        On PostgreSQL concurrent dispatchers skip each other's rows (``SKIP LOCKED``).
        """
        q = self.q
        lease_until = now_us + lease_us
        with self.engine.write() as c:
            rows = c.execute(q["claim_fires"], {"owner": owner, "lease_until_us": lease_until,
                                                "now_us": now_us, "lane": lane, "limit": limit}).fetchall()
            fires = [_fire(r) for r in rows]
            for f in fires:
                c.execute(q["insert_attempt"], {
                    "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
                    "seq": f.seq, "attempt": f.attempts, "started_us": now_us, "node": owner})
            versions: dict[tuple[str, int], TriggerVersion] = {}
            targets: dict[str, Target] = {}
            jobs = []
            for f in fires:
                vk = (f.trigger_id, f.version)
                v = versions.get(vk)
                if v is None:
                    row = c.execute(q["get_version"], {"trigger_id": f.trigger_id, "version": f.version}).fetchone()
                    v = versions[vk] = _version(row)
                t = targets.get(v.target_id)
                if t is None:
                    row = c.execute(q["targets_by_ids"], {"id": v.target_id}).fetchone()
                    t = targets[v.target_id] = _target(row)
                until = lease_until
                own = now_us + int(v.policies.timeout_s * 1e6) + lease_margin_us
                if lease_margin_us and own != lease_until:
                    # The lease covers this attempt's own deadline plus the margin.
                    c.execute(q["set_lease"], {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                                               "scheduled_us": f.scheduled_us, "seq": f.seq,
                                               "owner": owner, "until_us": own})
                    until = own
                jobs.append(DispatchJob(f, f.attempts, t, v.payload, v.policies, owner, until, v.schedule))
        return jobs

    def settle_attempts(self, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """Finish each job's attempt row and settle its fire — a terminal state, or back to
        ``pending`` with ``next_attempt_us`` for a retry — in one transaction.

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished.
        """
        out = []
        with self.engine.write() as c:
            for it in items:
                f = it.job.fire
                key = {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                       "scheduled_us": f.scheduled_us, "seq": f.seq}
                c.execute(self.q["finish_attempt"], {
                    **key, "attempt": it.job.attempt, "finished_us": now_us, "result": it.result,
                    "http_status": it.http_status, "error": it.error})
                terminal = it.state != "pending"
                out.append(_one(c.execute(self.q["settle_fire"], {
                    **key, "state": it.state, "cause": it.cause, "next_attempt_us": it.next_attempt_us,
                    "finished_us": now_us if terminal else None, "owner": it.job.lease_owner,
                    "attempt": it.job.attempt}).rowcount, "settle_fire"))
        return out

    # --- history --------------------------------------------------------------------------------

    def list_fires(self, tenant_id: str, trigger_id: str, after: tuple[int, int] | None = None,
                   limit: int = 100) -> list[Fire]:
        """Fires of one trigger, oldest first, after the cursor (scheduled_us, seq), with attempts."""
        after_us, after_seq = after if after is not None else (-(2**62), -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["list_fires"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                    "after_us": after_us, "after_seq": after_seq,
                                                    "limit": limit}).fetchall()
            fires = [_fire(r) for r in rows]
            if not fires:
                return []
            arows = c.execute(self.q["attempts_of_trigger_range"], {
                "tenant_id": tenant_id, "trigger_id": trigger_id, "from_us": fires[0].scheduled_us,
                "to_us": fires[-1].scheduled_us}).fetchall()
        by_key: dict[tuple[int, int], list[Attempt]] = {}
        for r in arows:
            by_key.setdefault((r[0], r[1]), []).append(Attempt(*r[2:]))
        return [_with_attempts(f, by_key.get((f.scheduled_us, f.seq), [])) for f in fires]

    def get_fire(self, key: FireKey) -> Fire | None:
        params = {"tenant_id": key.tenant_id, "trigger_id": key.trigger_id,
                  "scheduled_us": key.scheduled_us, "seq": key.seq}
        with self.engine.read() as c:
            row = c.execute(self.q["get_fire"], params).fetchone()
            if not row:
                return None
            arows = c.execute(self.q["attempts_of_trigger_range"], {
                "tenant_id": key.tenant_id, "trigger_id": key.trigger_id, "from_us": key.scheduled_us,
                "to_us": key.scheduled_us}).fetchall()
        attempts = [Attempt(*r[2:]) for r in arows if r[1] == key.seq]
        return _with_attempts(_fire(row), attempts)

    def oldest_undispatched_us(self, now_us: int) -> int | None:
        """The oldest instant that is due (≤ ``now_us``) but not yet decided, or decided but not
        yet delivered; None when nothing is waiting."""
        with self.engine.read() as c:
            due = c.execute(self.q["earliest_due"]).fetchone()[0]
            fired = c.execute(self.q["oldest_undelivered"]).fetchone()[0]
        waiting = [int(x) for x in (due, fired) if x is not None and int(x) <= now_us]
        return min(waiting) if waiting else None

    def server_time_us(self) -> int:
        """The database server's clock (PostgreSQL ``clock_timestamp()``), µs since the epoch."""
        with self.engine.read() as c:
            return int(c.execute(self.q["server_time_us"]).fetchone()[0])

    def count_fires(self) -> int:
        with self.engine.read() as c:
            return int(c.execute(self.q["count_fires"]).fetchone()[0])


def _fire_params(f: NewFire) -> dict[str, Any]:
    """Bind parameters of ``insert_fire`` for a decided fire (live fires get their first dispatch
    time — the smeared one when set — terminal ones their finish time)."""
    pending = f.state == FireState.PENDING
    return {
        "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
        "seq": f.seq, "version": f.version, "kind": f.kind.value, "lane": f.lane.value,
        "state": f.state.value, "cause": f.cause, "decided_us": f.decided_us, "decided_by": f.decided_by,
        "finished_us": None if pending or f.state == FireState.HELD else f.decided_us,
        "tzdata_version": f.tzdata_version,
        "next_attempt_us": (f.not_before_us if f.not_before_us is not None else f.decided_us) if pending else None,
        "eps_us": f.eps_us, "eps_source": f.eps_source,
    }


def _advance_params(a: Advance) -> dict[str, Any]:
    return {"trigger_id": a.trigger_id, "expected_next_us": a.expected_next_us,
            "expected_version": a.expected_version, "new_next_us": a.new_next_us, "new_version": a.new_version}


def _with_attempts(f: Fire, attempts: list[Attempt]) -> Fire:
    from dataclasses import replace

    return replace(f, attempt_list=tuple(attempts))


def _split(sql: str) -> list[str]:
    """Split a migration into statements (no ';' inside literals; a ``CREATE TRIGGER … BEGIN …; END``
    body stays one statement: pieces are joined until SQLite says the statement is complete)."""
    import sqlite3

    lines = [ln for ln in sql.splitlines() if not ln.strip().startswith("--")]
    out: list[str] = []
    buf = ""
    for piece in "\n".join(lines).split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n\t;"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" \n\t;"):
        out.append(buf.strip())
    return out


__all__ = ["InvariantViolation", "SchemaError", "Settlement", "SqlStore", "StoreError"]
