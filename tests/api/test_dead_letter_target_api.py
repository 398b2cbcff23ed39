"""``dead_letter_target_id`` on a trigger (decision 0178): set on create or amend by an author, shown
in the trigger, removed with ``null``; refused (422 naming the field, nothing written) unless it is a
verified ``http`` or ``queue`` target of the tenant — another tenant's reads as missing; a queue
consumer pulling a delivery finds the dead fire's history attached."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import Api, assert_problem
from fireledger.domain.keys import DEAD_LETTER_SEQ, FireKey
from test_dispatch_api import WIDE, deliver_all, one_shot

S = 1_000_000


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


def _deliver_catch_up(api: Api) -> list[str]:
    """Claim the catch-up lane (where delivery records wait) and settle each attempt delivered."""
    from fireledger.dispatch.lanes import DispatchConfig
    from fireledger.dispatch.runner import _Shaper
    from fireledger.domain.dispatch_records import Settlement

    now = api.clock.now().latest_us
    res = api.store.dispatch.claim_shaped(now, "d", {"catch-up": 100}, _Shaper(DispatchConfig(), WIDE), 5 * S)
    assert all(api.store.dispatch.settle_dispatch(
        [Settlement(c.job, "delivered", None, None, "delivered", None, None) for c in res.jobs], now))
    return [str(FireKey(c.job.fire.tenant_id, c.job.fire.trigger_id, c.job.fire.scheduled_us, c.job.fire.seq))
            for c in res.jobs]


def test_set_shown_amended_removed_and_checked_like_a_target(api: Api) -> None:
    _, s = api.tenant("acme")
    main = s.target()["id"]
    dlq = s.target("https://dlq.example.com/dead")["id"]
    queue = s.post("/v1/targets", json={"kind": "queue"}).json()["id"]
    t = s.trigger(main, {"every": "1h"}, dead_letter_target_id=dlq)
    assert t["dead_letter_target_id"] == dlq
    assert s.get(f"/v1/triggers/{t['id']}").json()["dead_letter_target_id"] == dlq
    plain = s.trigger(main, {"every": "1h"})
    assert plain["dead_letter_target_id"] is None
    r = s.patch(f"/v1/triggers/{t['id']}", json={"dead_letter_target_id": queue})
    assert r.status_code == 200 and r.json()["dead_letter_target_id"] == queue and r.json()["version"] == 2
    r = s.patch(f"/v1/triggers/{t['id']}", json={"dead_letter_target_id": None})
    assert r.status_code == 200 and r.json()["dead_letter_target_id"] is None
    unverified = s.target("https://new.example.com/dlq", verified=False)["id"]
    _, other = api.tenant("other")
    theirs = other.target("https://theirs.example.com/dlq")["id"]
    before = api.snapshot()
    for bad, problem in ((unverified, "verif"), (theirs, "no such target"), ("tg_missing", "no such target")):
        body = assert_problem(s.patch(f"/v1/triggers/{t['id']}", json={"dead_letter_target_id": bad}), 422,
                              "dead_letter_target_id")
        assert problem in body["detail"]
        assert_problem(s.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1h"}, "target_id": main,
                                                    "dead_letter_target_id": bad}), 422, "dead_letter_target_id")
    assert api.snapshot() == before
    assert_problem(s.patch(f"/v1/triggers/{t['id']}", json={"dead_letter_target_id": "x" * 101}), 422,
                   "dead_letter_target_id")


def test_a_queue_consumer_receives_the_dead_fire_with_its_history(api: Api) -> None:
    _, s = api.tenant("acme")
    work = s.post("/v1/targets", json={"kind": "queue"}).json()["id"]
    dlq = s.post("/v1/targets", json={"kind": "queue"}).json()["id"]
    trig = one_shot(s, work, api)
    assert s.patch(f"/v1/triggers/{trig['id']}", json={"dead_letter_target_id": dlq}).status_code == 200
    api.clock.advance(61 * S)
    [key] = deliver_all(api, result="failed")
    fk = FireKey.parse(key)
    assert s.get(f"/v1/fires/{key}").json()["state"] == "failed"
    api.clock.advance(S)
    want = str(FireKey(fk.tenant_id, fk.trigger_id, fk.scheduled_us, DEAD_LETTER_SEQ))
    assert _deliver_catch_up(api) == [want]   # the delivery record, put on the dead-letter queue
    [msg] = s.post(f"/v1/queues/{dlq}/pull", json={}).json()["messages"]
    assert msg["fire_key"] == want and msg["body"]["kind"] == "dead-letter"
    dead = msg["body"]["dead_letter"]
    assert dead["key"] == key and dead["state"] == "failed" and [a["attempt"] for a in dead["attempts"]] == [1]
    assert s.post(f"/v1/queues/{work}/pull", json={}).json()["messages"] == []
    history = s.get(f"/v1/triggers/{trig['id']}/fires").json()["items"]
    assert [(f["key"], f["kind"], f["state"]) for f in history] == [(key, "scheduled", "failed"),
                                                                     (want, "dead-letter", "delivered")]


def test_the_console_trigger_page_shows_the_dead_letter_target_and_its_badge(api: Api) -> None:
    """Issue 17 item 2: the trigger page names the dead-letter target, with its verification badge
    (an ``http`` target's; a queue needs none), and says when there is none."""
    import re

    _, s = api.tenant("acme")
    main = s.target()["id"]
    dlq = s.target("https://dlq.example.com/dead")["id"]
    queue = s.post("/v1/targets", json={"kind": "queue"}).json()["id"]
    page = api.http.get("/console/login")
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    assert api.http.post("/console/login", data={**fields, "token": s.token}, follow_redirects=False).status_code == 303

    def dead_letter_line(trigger_id: str) -> str:
        html = api.http.get(f"/console/triggers/{trigger_id}").text
        m = re.search(r'<p id="dead-letter-target"[^>]*>(.*?)</p>', html, re.S)
        assert m, html[:600]
        return m.group(1)

    line = dead_letter_line(s.trigger(main, {"every": "1h"}, dead_letter_target_id=dlq)["id"])
    assert f"<code>{dlq}</code>" in line and "default retry policy" in line
    assert re.search(r'<span class="state badge-ok" title="ownership verified[^"]*">verified</span>', line), line
    line = dead_letter_line(s.trigger(main, {"every": "1h"}, dead_letter_target_id=queue)["id"])
    assert f"<code>{queue}</code>" in line and "badge-" not in line               # a queue: no badge
    line = dead_letter_line(s.trigger(main, {"every": "1h"})["id"])
    assert "No dead-letter target" in line and "<code>" not in line
