"""Helpers for the tzdata-upgrade tests (issue 18 item 8): a tiny TZif tree of "other" zone rules,
and a due row left by a node that ran an older tzdata."""

from __future__ import annotations

import shutil
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from fireledger.domain.keys import to_us
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire

LONDON_9 = {"cron": "0 9 * * *", "zone": "Europe/London"}


def us(text: str) -> int:
    """An RFC 3339 instant as µs since the epoch."""
    return to_us(datetime.fromisoformat(text.replace("Z", "+00:00")))


def other_rules(tmp: Path) -> Path:
    """A TZif tree whose Europe/London holds New York's rules (and no other zone), version 2099z:
    London's 09:00 in January is then 14:00Z instead of 09:00Z."""
    root = tmp / "zoneinfo"
    (root / "Europe").mkdir(parents=True)
    src = resources.files("tzdata.zoneinfo").joinpath("America").joinpath("New_York")
    with src.open("rb") as fh, (root / "Europe" / "London").open("wb") as out:
        shutil.copyfileobj(fh, out)
    (root / "tzdata.zi").write_text("# version 2099z\n", encoding="utf-8")
    return root


def decided_under_old_rules(store: Any, trig: Any, first: int, old_next: int) -> None:
    """Record ``first`` decided by a node on tzdata 2019c that advanced the due row to ``old_next``."""
    fire = NewFire(trig.tenant_id, trig.id, first, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                   first + 5, "2019c", "old-node")
    out = store.timing.apply_decisions([Decision(Advance(trig.id, first, 1, old_next, 1), (fire,))])
    assert out[0].advanced
