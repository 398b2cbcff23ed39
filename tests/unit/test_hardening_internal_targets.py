"""Hardening (issue 13, finding 7) — the class: *an in-process callable is never open to a tenant by
omission*. A registration names the tenants whose ``internal`` targets may call it, or says
``public=True``; anything else is refused at registration, and a tenant not named is refused at call
time (``failed``, the callable never runs). Real registry, real calls (sync and async)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from fireledger.dispatch.internal import InternalCall, InternalRegistry


def _call(key: str = "tn_a.tr_b.20260101T000000Z.0") -> InternalCall:
    return InternalCall(key, "tr_b", datetime(2026, 1, 1, tzinfo=UTC), 1, "on-time", "scheduled", 1, {"p": 1})


@pytest.mark.parametrize(("kwargs", "says"), [
    ({}, "open to no tenant"),
    ({"tenants": None}, "open to no tenant"),
    ({"tenants": set()}, "open to no tenant"),
    ({"tenants": []}, "open to no tenant"),
    ({"public": False}, "open to no tenant"),
    ({"tenants": {"tn_a"}, "public": True}, "not both"),
    ({"tenants": "tn_a"}, "not one string"),
    ({"tenants": {""}}, "non-empty tenant id"),
])
def test_a_registration_that_names_no_tenant_is_refused(kwargs, says):
    reg = InternalRegistry()
    with pytest.raises(ValueError, match=says):
        reg.register("billing.close_day", lambda call: None, **kwargs)
    with pytest.raises(ValueError, match=says):   # the decorator form too
        reg.register("billing.close_day", **kwargs)(lambda call: None)
    assert reg.names() == []


def test_only_the_named_tenants_reach_a_callable_and_public_reaches_all():
    reg = InternalRegistry()
    ran: list[tuple[str, str]] = []

    def closed(call: InternalCall) -> None:
        ran.append(("closed", call.fire_key))

    async def open_to_all(call: InternalCall) -> None:
        ran.append(("public", call.fire_key))

    reg.register("closed", closed, tenants={"tn_a", "tn_b"})
    reg.register("open", open_to_all, public=True)

    async def go() -> list:
        return [
            await reg.call("closed", "tn_a", _call("k1"), 2.0),
            await reg.call("closed", "tn_c", _call("k2"), 2.0),
            await reg.call("open", "tn_c", _call("k3"), 2.0),
        ]

    a, c, pub = asyncio.run(go())
    assert a.outcome == "delivered" and pub.outcome == "delivered"
    assert c.outcome == "failed" and not c.sent and "not open to this tenant" in c.error
    assert ran == [("closed", "k1"), ("public", "k3")], "a tenant not named reached the callable"
