"""``fireledger tzdata diff`` as an operator runs it: a real process on a real store (issue 18 item 8).

The other rules are the test's TZif tree (New York's rules under the name Europe/London,
:func:`tzkit.other_rules`). ``--json`` lists the trigger whose instants differ, with both
rule versions; ``--apply`` re-resolves the stale one and audits it; a second run lists nothing stale;
the table form names the trigger; bad input exits 2 with one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e import cli
from fireledger.recurrence import TZDATA_VERSION
from storekit import add_target, add_tenant, add_trigger
from tzkit import LONDON_9, decided_under_old_rules, other_rules
from tzkit import us as _us


def _db(store: Any) -> str:
    return store.engine.url if store.engine_name == "postgres" else f"sqlite:///{store.engine.path}"


def test_diff_lists_and_apply_reresolves(store: Any, tmp_path: Path) -> None:
    tree = other_rules(tmp_path)
    t = add_tenant(store)
    tg = add_target(store, t)
    fresh, _, _ = add_trigger(store, t, tg, LONDON_9)
    old, _, old_first = add_trigger(store, t, tg, LONDON_9)
    decided_under_old_rules(store, old, old_first, _us("2027-01-16T14:00:00Z"))
    add_trigger(store, t, tg, {"every": "1h"})
    db = _db(store)

    out = json.loads(cli("tzdata", "diff", "--db", db, "--against", str(tree), "--count", "2", "--json").stdout)
    assert out["running_tzdata"] == TZDATA_VERSION
    assert out["against"] == {"path": str(tree), "version": "2099z"}
    assert (out["live"], out["unaffected"], out["applied"]) == (3, 1, False)
    by_id = {c["trigger_id"]: c for c in out["changes"]}
    assert set(by_id) == {fresh.id, old.id}
    assert by_id[fresh.id]["other"] == ["2027-01-15T14:00:00Z", "2027-01-16T14:00:00Z"]
    assert by_id[fresh.id]["running"] == ["2027-01-15T09:00:00Z", "2027-01-16T09:00:00Z"]
    assert by_id[old.id]["stale"] and by_id[old.id]["recorded_tzdata"] == "2019c"
    assert by_id[old.id]["reresolved"] is None

    table = cli("tzdata", "diff", "--db", db, "--against", str(tree)).stdout
    assert old.id in table and "2099z" in table

    applied = json.loads(cli("tzdata", "diff", "--db", db, "--apply", "--json").stdout)
    assert [(c["trigger_id"], c["reresolved"]) for c in applied["changes"]] == [(old.id, True)]
    assert {r.trigger_id: r.next_us for r in store.timing.due_index()}[old.id] == _us("2027-01-16T09:00:00Z")
    again = json.loads(cli("tzdata", "diff", "--db", db, "--json").stdout)
    assert again["changes"] == []
    audit = [a for a in store.trust.audit_rows(tenant_id=t.id) if a.action == "trigger.tzdata_reresolve"]
    assert len(audit) == 1

    bad = cli("tzdata", "diff", "--db", db, "--against", str(tmp_path / "nope"), check=False)
    assert bad.returncode == 2 and "--against" in bad.stderr
    bad = cli("tzdata", "diff", "--db", db, "--count", "0", check=False)
    assert bad.returncode == 2 and "--count" in bad.stderr
