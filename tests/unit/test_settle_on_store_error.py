"""An attempt whose preparation failed because the *store* failed (a PostgreSQL failover) is tried
again under the same key; any other unexpected error still ends the fire (issue 16)."""

from __future__ import annotations

from fireledger.dispatch.http import HttpResult
from fireledger.dispatch.settling import STORE_RETRY_US, settle_on_error
from fireledger.domain.model import DispatchJob, Fire, Policies, Target
from fireledger.store import StoreError
from fireledger.store.sqlitelib import sqlite3

T0 = 1_800_000_000_000_000


def _job() -> DispatchJob:
    fire = Fire("tn_a", "tr_9", T0, 0, 3, "scheduled", "on-time", "dispatching", None, T0, "n", T0, None, "2026f",
                1, None)
    tg = Target("tg_1", "tn_a", "http", "http://127.0.0.1:9/hook", "whsec_x", "verified", "v", T0)
    return DispatchJob(fire, 1, tg, b"{}", Policies(), "d", T0)


def test_store_error_before_sending_is_retried_under_the_same_key():
    for exc in (StoreError("cannot connect to PostgreSQL"), sqlite3.OperationalError("disk I/O error")):
        s = settle_on_error(_job(), None, exc, T0 + 5)
        assert (s.state, s.cause, s.next_attempt_us) == ("pending", None, T0 + 5 + STORE_RETRY_US)
        assert s.error == f"store error: {type(exc).__name__}"


def test_other_errors_and_sent_attempts_are_unchanged():
    failed = settle_on_error(_job(), None, KeyError("bug"), T0)
    assert failed.state == "failed" and failed.cause is not None and "KeyError" in failed.cause
    sent = HttpResult("delivered", 200, None, 0.1, sent=True)
    unknown = settle_on_error(_job(), sent, StoreError("lost"), T0)
    assert unknown.state == "unknown"                      # it may have reached the target: never resent blindly
    assert settle_on_error(_job(), None, StoreError("x")).state == "failed"   # no clock given: old behaviour
