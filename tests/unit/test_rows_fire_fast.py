"""``rows.fire`` builds a Fire slot by slot (decision 0236): the record equals the one the dataclass's
own constructor makes from the same row, for every row shape the store reads."""

from __future__ import annotations

from fireledger.domain.model import Fire, FireKind, FireState, Lane
from fireledger.store import rows

BASE = ("t", "trig", 1_700_000_000_000_000, 3, 2, "catch-up", "catch-up", "dispatching", "a cause",
        1_700_000_000_000_001, "node-a", 1_700_000_000_000_002, None, "2026f", 4, 1_700_000_000_000_003)
EXTRA = (1, 1_700_000_000_000_004, 250, "declared", "gap 02:30", "0,2")


def _expected(row: tuple[object, ...]) -> Fire:
    n = len(row)
    return Fire(row[0], row[1], row[2], row[3], row[4], FireKind(row[5]), Lane(row[6]), FireState(row[7]),
                row[8], row[9], row[10], row[11], row[12], row[13], row[14], row[15],
                eps_us=row[18] if n > 18 else None, eps_source=row[19] if n > 19 else None,
                attempt_base=row[16] if n > 16 else 0, redriven_us=row[17] if n > 17 else None,
                dst=row[20] if n > 20 else None, specs=row[21] if n > 21 else None)


def test_every_row_shape_gives_the_constructors_record() -> None:
    for extra in range(len(EXTRA) + 1):
        row = BASE + EXTRA[:extra]
        got = rows.fire(row)
        want = _expected(row)
        assert got == want and hash(got.scheduled_us) == hash(want.scheduled_us)
        assert type(got) is Fire and got.attempt_list == () and got.kind is want.kind and got.lane is want.lane
    full = rows.fire(BASE + EXTRA)
    assert (full.attempt_base, full.redriven_us, full.eps_us, full.eps_source, full.dst, full.specs) == (
        1, 1_700_000_000_000_004, 250, "declared", "gap 02:30", "0,2")
