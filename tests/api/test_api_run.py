"""Manual run: one `manual` fire with its own key, committed now, audited, then dispatched."""

from __future__ import annotations

from apikit import Api, assert_problem
from fireledger.domain.keys import FireKey


def test_run_now_commits_a_manual_fire_with_its_own_key(tmp_path):
    api = Api(tmp_path)
    try:
        tenant_id, s = api.tenant("acme")
        tg = s.target()
        tr = s.trigger(tg["id"], {"every": "60s"})
        before = api.changes
        resp = s.post(f"/v1/triggers/{tr['id']}/run")
        assert resp.status_code == 201, resp.text
        fire = resp.json()
        assert (fire["kind"], fire["lane"], fire["state"]) == ("manual", "on-time", "pending")
        key = FireKey.parse(fire["key"])
        assert (key.tenant_id, key.trigger_id, key.seq) == (tenant_id, tr["id"], 1)
        assert api.changes == before + 1
        # The scheduled trigger is untouched: its next instant and version stay.
        assert s.get(f"/v1/triggers/{tr['id']}").json()["next_instant"] == tr["next_instant"]
        # Claimable by the dispatch plane at once (it is committed, its instant ≤ now).
        jobs = api.store.dispatch.claim_dispatch("on-time", api.clock.now().latest_us, 10, "d", 30_000_000)
        assert [str(FireKey(j.fire.tenant_id, j.fire.trigger_id, j.fire.scheduled_us, j.fire.seq))
                for j in jobs] == [fire["key"]]
        # Audited with the actor.
        rows = [r for r in api.store.trust.audit_rows(tenant_id=tenant_id) if r.action == "trigger.run"]
        assert len(rows) == 1
        # A second run at the very same instant (fake clock) is refused, not duplicated.
        assert_problem(s.post(f"/v1/triggers/{tr['id']}/run"), 409)
        # Paused triggers are not run; another tenant gets 404.
        s.post(f"/v1/triggers/{tr['id']}/pause")
        assert_problem(s.post(f"/v1/triggers/{tr['id']}/run"), 409)
        _, other = api.tenant("other")
        assert_problem(other.post(f"/v1/triggers/{tr['id']}/run"), 404)
    finally:
        api.close()
