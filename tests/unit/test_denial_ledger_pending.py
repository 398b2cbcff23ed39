"""``DenialLedger.pending()`` (decision 0091): a summary whose append has not returned is still
pending, so a caller that waits for 0 finds every counted refusal in the audit. CI once read the audit
in the gap: the flusher had taken the window (pending 0) and was still writing its summary."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from fireledger.control.denials import DenialLedger


class _SlowAudit:
    """An audit whose appends wait for ``release`` (a store that is slow to commit)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def append_audit(self, tenant_id: Any, actor: str, action: str, at_us: int, prior: Any,
                     new: dict[str, Any]) -> None:
        self.entered.set()
        assert self.release.wait(10)
        self.rows.append(new)


def test_a_summary_being_appended_is_still_pending_and_counts_once_written() -> None:
    now = [0]
    audit = _SlowAudit()
    ledger = DenialLedger(SimpleNamespace(trust=audit), lambda: now[0], per_window=2, flush_every_s=3600)
    for _ in range(7):   # 2 written one by one (returned to the caller, not written here), 5 counted
        ledger.note("tn_a", "pr_reader", "role:admin", {"request": "POST /v1/triggers"}, "POST /v1/triggers")
    assert ledger.pending() == 5
    now[0] += 61_000_000   # the window ends
    flusher = threading.Thread(target=ledger.flush)
    flusher.start()
    assert audit.entered.wait(10)        # the summary was taken from its window and is being appended
    assert ledger.pending() == 5         # ... and is still pending (before the fix: 0)
    audit.release.set()
    flusher.join(10)
    assert ledger.pending() == 0
    [summary] = audit.rows
    assert summary["summary"] is True and summary["count"] == 5


def test_a_summary_that_cannot_be_appended_is_no_longer_pending() -> None:
    class Down:
        def append_audit(self, *args: Any) -> None:
            raise OSError("the store is down")

    now = [0]
    ledger = DenialLedger(SimpleNamespace(trust=Down()), lambda: now[0], per_window=1, flush_every_s=3600)
    for _ in range(4):
        ledger.note(None, "anonymous", "invalid-token", {"request": "GET /v1/triggers"}, "invalid-token")
    now[0] += 61_000_000
    assert ledger.flush() == 3           # the count it tried to write (the loss is logged)
    assert ledger.pending() == 0
