"""The body of an HTTP dispatch is assembled from parts (decision 0139); it must be byte for byte the
``json.dumps`` of DESIGN.md §4's object, whatever the payload and identifiers hold."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.dispatch.settling import dispatch_body
from fireledger.domain.keys import from_us
from fireledger.domain.model import DispatchJob, Fire, Policies, Target
from fireledger.recurrence import format_instant

T0 = 1_767_225_600_000_000

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
                    max_leaves=12)


def _job(payload: bytes, trigger_id: str, attempt: int, lane: str, kind: str, version: int) -> DispatchJob:
    fire = Fire("tn_1", trigger_id, T0 + attempt, 0, version, kind, lane, "dispatching", None, T0, "n", T0, None,
                "2026f", attempt, None)
    target = Target("tg_1", "tn_1", "http", "http://127.0.0.1:1/hook", "whsec_x", "verified", "v", T0)
    return DispatchJob(fire, attempt, target, payload, Policies(), "d", T0)


def _reference(job: DispatchJob, key: str) -> bytes:
    f = job.fire
    return json.dumps({
        "fire_key": key, "trigger_id": f.trigger_id, "scheduled_instant": format_instant(from_us(f.scheduled_us)),
        "attempt": job.attempt, "lane": f.lane, "kind": f.kind, "version": f.version,
        "payload": json.loads(job.payload) if job.payload else {},
    }, separators=(",", ":")).encode()


@settings(max_examples=200, deadline=None)
@given(payload=JSON, trigger_id=st.text(min_size=1), attempt=st.integers(1, 50),
       lane=st.sampled_from(["on-time", "catch-up", "backfill"]), kind=st.sampled_from(["scheduled", "backfill"]),
       version=st.integers(1, 10**6))
def test_body_is_the_reference_json_bytes(payload, trigger_id, attempt, lane, kind, version):
    raw = json.dumps(payload).encode()
    job = _job(raw, trigger_id, attempt, lane, kind, version)
    key = f"fk.{trigger_id}.{attempt}"
    assert dispatch_body(job, key) == _reference(job, key)
    assert dispatch_body(job, key) == _reference(job, key)   # the second time from the remembered encoding


def test_empty_payload_is_an_empty_object():
    job = _job(b"", "tr_1", 1, "on-time", "scheduled", 1)
    assert json.loads(dispatch_body(job, "k"))["payload"] == {}
    assert dispatch_body(job, "k") == _reference(job, "k")
