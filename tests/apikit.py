"""Harness for the control-API tests: a real Store on a temp SQLite file, a FakeClock, the app
under FastAPI's TestClient, and a record of every response body (so tests can prove a sentinel
payload never leaves the store).

(Named ``test_api_*`` only so it may live beside the API tests; it defines no tests of its own
except a self-check of the harness.)
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from fireledger.clock import FakeClock
from fireledger.control import create_app
from fireledger.control.auth import create_tenant
from fireledger.domain.keys import to_us
from fireledger.store import Store

#: Friday 2026-03-27 12:00:00 UTC (Paris is on CET, UTC+1, until Sunday 29 March 01:00 UTC).
T0 = to_us(datetime(2026, 3, 27, 12, 0, tzinfo=UTC))
SENTINEL = "SENTINEL-d41f7c-never-in-a-response"
PROBLEM = "application/problem+json"
TABLES = ("tenants", "principals", "targets", "triggers", "trigger_versions", "due", "fires", "attempts",
          "signals")


def us(text: str) -> int:
    return to_us(datetime.fromisoformat(text.replace("Z", "+00:00")))


class Session:
    """Requests as one principal (or anonymously), each response body recorded by the harness."""

    def __init__(self, api: Api, token: str | None) -> None:
        self.api = api
        self.token = token

    def request(self, method: str, path: str, **kw: Any) -> Any:
        headers = dict(kw.pop("headers", None) or {})
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        resp = self.api.http.request(method, path, headers=headers, **kw)
        self.api.bodies.append(resp.content)
        return resp

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def patch(self, path: str, **kw: Any) -> Any:
        return self.request("PATCH", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    # conveniences ----------------------------------------------------------------------------

    def target(self, url: str = "https://hooks.example.com/fire", *, verified: bool = True) -> dict[str, Any]:
        """Create a target; ``verified`` marks its ownership proved through the store (the HTTP
        challenge itself is exercised against a real sink in tests/api/test_trust_targets.py)."""
        r = self.post("/v1/targets", json={"kind": "http", "url": url})
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        if verified:
            trust = self.api.store.trust.target_trust(out["id"])
            now = self.api.clock.now().latest_us
            assert trust is not None and self.api.store.trust.set_target_verification(
                trust.tenant_id, trust.id, "verified", now, now + 30 * 86_400_000_000, None, "test", now)
        return out

    def trigger(self, target_id: str, schedule: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        body = {"name": "weekday report", "schedule": schedule or {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"},
                "target_id": target_id, "payload": {"secret": SENTINEL}, **fields}
        r = self.post("/v1/triggers", json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]


class Api:
    def __init__(self, tmp_path: Path, *, allow_private_targets: bool = False,
                 metrics_cache_s: float | None = None, settings: Any = None) -> None:
        self.store = Store.open(f"sqlite:///{tmp_path}/api.db")
        self.clock = FakeClock(true_us=T0)
        self.changes = 0
        self._tenants = 0
        self.bodies: list[bytes] = []
        self.app = create_app(self.store, self.clock, on_definition_change=self._changed,
                              allow_private_targets=allow_private_targets, metrics_cache_s=metrics_cache_s,
                              settings=settings)
        self.http = TestClient(self.app, raise_server_exceptions=False)
        self.http.__enter__()  # one event loop for the whole test (and the app's lifespan)
        self.anon = Session(self, None)

    def _changed(self) -> None:
        self.changes += 1

    def tenant(self, name: str) -> tuple[str, Session]:
        """A new tenant (the name is made unique) and a session holding its all-roles token."""
        self._tenants += 1
        tenant_id, token = create_tenant(self.store, f"{name}-{self._tenants}", T0)
        return tenant_id, Session(self, token)

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every registry/ledger table: equal snapshots mean nothing changed."""
        conn = self.store.engine.connection()
        return {t: sorted(tuple(r) for r in conn.execute(f"SELECT * FROM {t}").fetchall()) for t in TABLES}

    def assert_no_sentinel(self) -> None:
        for body in self.bodies:
            assert SENTINEL.encode() not in body, body[:300]

    def close(self) -> None:
        self.http.__exit__(None, None, None)
        self.store.close()


def assert_problem(resp: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """``resp`` is an RFC 9457 problem with ``status`` (and, if given, an error naming ``field``)."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM), resp.headers["content-type"]
    body = resp.json()
    assert {"type", "title", "status", "detail"} <= set(body), body
    assert body["status"] == status
    assert isinstance(body["detail"], str) and body["detail"]
    assert "Traceback" not in resp.text
    if field is not None:
        fields = [e["field"] for e in body.get("errors", [])]
        assert field in fields, (field, body)
    return body  # type: ignore[no-any-return]


