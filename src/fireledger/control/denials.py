"""The bounded audit of refusals (decision 0091): every refusal is counted, few are written one by one.

A refusal (403 for a missing role; 401 for a bearer token that is not valid) is a ``denied`` audit row,
but a client can cause refusals as fast as it can send requests, and every audit row serialises on the
chain's head (and, on SQLite, on the one writer shared with timing and dispatch). So refusals are
accounted per *key* and *window*:

* key: ``(tenant, principal, "role:<missing role>")`` for an authenticated principal; for a token that
  is not valid, one key per reason for the whole process (``actor = "anonymous"``, tenant none), so
  rotating source addresses or tokens does not multiply the rows;
* window: :data:`WINDOW_S` seconds from the key's first refusal, on the control plane's clock.

The first :data:`PER_WINDOW` refusals of a key in a window are written one row each, as before
(``new`` holds the request line, the reason and ``"count": 1``). Further ones are only counted, in
memory; when the window ends one *summary* row is written (``"summary": true``, ``"count": n``, the
first and last instant, and the count per route or reason). The summary is written by the next
refusal of any key after the window ended, by a flusher thread (every :data:`FLUSH_EVERY_S`), or by
:meth:`DenialLedger.close` when the process stops. So:

* rows per key and window ≤ ``PER_WINDOW + 1``; keys tracked at once ≤ :data:`MAX_KEYS` (beyond it,
  refusals fold into one ``overflow`` key per tenant-less reason), so the write rate is bounded
  whatever the clients do;
* the sum of ``count`` over ``denied`` rows is exact for every refusal whose row or summary was
  written; a process killed without a stop loses the counts of its open windows (at most one window
  of each key): the audit then holds *at least* the first refusals of each key and window.

Nothing here holds a payload, a token or a request body: the request line (method and path, capped),
the route template and the missing role only.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fireledger.waker import Waker

log = logging.getLogger("fireledger.control")

#: Length of an accounting window, seconds.
WINDOW_S = 60.0
#: Refusals of one key written one row each per window; the rest are summarised.
PER_WINDOW = 10
#: Keys tracked at once (beyond: folded into an ``overflow`` key).
MAX_KEYS = 10_000
#: How often the flusher thread writes the summaries of windows that ended, seconds.
FLUSH_EVERY_S = 1.0
#: Distinct routes/reasons named in one summary (beyond: counted under ``"other"``).
MAX_BREAKDOWN = 50

Key = tuple[str | None, str, str]


@dataclass(frozen=True, slots=True)
class DenialRow:
    """One ``denied`` row to append: ``new`` always carries ``count``."""

    tenant_id: str | None
    actor: str
    at_us: int
    new: dict[str, Any]


@dataclass(slots=True)
class _Window:
    start_us: int
    written: int = 0
    suppressed: int = 0
    first_us: int = 0
    last_us: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)


class DenialLedger:
    """Per-process accounting of refusals (thread-safe); see the module docstring for the contract.

    ``now_us`` is the control plane's clock (its latest bound). :meth:`note` is cheap and never touches
    the store: it returns the rows to append now, which the caller writes off the event loop with
    :meth:`write`.
    """

    def __init__(self, store: Any, now_us: Callable[[], int], *, window_s: float = WINDOW_S,
                 per_window: int = PER_WINDOW, max_keys: int = MAX_KEYS,
                 flush_every_s: float = FLUSH_EVERY_S) -> None:
        if window_s <= 0 or per_window < 1 or max_keys < 1:
            raise ValueError("window_s, per_window and max_keys must be positive")
        self.store = store
        self.now_us = now_us
        self.window_us = int(window_s * 1_000_000)
        self.per_window = per_window
        self.max_keys = max_keys
        self.flush_every_s = flush_every_s
        self._lock = threading.Lock()
        self._windows: dict[Key, _Window] = {}
        self._order: deque[tuple[int, Key]] = deque()   # (window start, key), oldest first
        self._unwritten = 0   # refusals in summaries taken from their windows, not yet appended
        self._flusher: threading.Thread | None = None
        self._stop = Waker()   # a timed wait that returns under a faked clock (waker.py)
        self._closed = False

    # --- accounting -----------------------------------------------------------------------------

    def note(self, tenant_id: str | None, actor: str, reason: str, new: dict[str, Any],
             breakdown: str) -> list[DenialRow]:
        """Account one refusal by ``actor`` for ``reason`` (``new``: the row's content when it is
        written one by one; ``breakdown``: what a summary counts it under, e.g. the route template).
        Returns the rows to append now: this refusal's own (while the key's window has room) and the
        summaries of windows that have ended."""
        now = self.now_us()
        with self._lock:
            rows = self._take_ended(now)
            key: Key = (tenant_id, actor, reason)
            w = self._windows.get(key)
            if w is None:
                if len(self._windows) >= self.max_keys:
                    key = (None, "overflow", reason)
                    w = self._windows.get(key)
                if w is None:
                    w = self._windows[key] = _Window(now)
                    self._order.append((now, key))
            if w.written < self.per_window and key[1] != "overflow":
                w.written += 1
                rows.append(DenialRow(tenant_id, actor, now, {**new, "count": 1}))
            else:
                if w.suppressed == 0:
                    w.first_us = now
                w.suppressed += 1
                w.last_us = now
                slot = breakdown if breakdown in w.breakdown or len(w.breakdown) < MAX_BREAKDOWN else "other"
                w.breakdown[slot] = w.breakdown.get(slot, 0) + 1
                self._ensure_flusher()
        return rows

    def _take_ended(self, now: int, *, everything: bool = False) -> list[DenialRow]:
        """Pop the windows that ended (all of them when ``everything``); summaries of those with
        uncounted refusals. Caller holds the lock."""
        out: list[DenialRow] = []
        while self._order and (everything or self._order[0][0] + self.window_us <= now):
            _, key = self._order.popleft()
            w = self._windows.pop(key, None)
            if w is not None and w.suppressed:
                out.append(self._summary(key, w, now))
                self._unwritten += w.suppressed
        return out

    def _summary(self, key: Key, w: _Window, now: int) -> DenialRow:
        from fireledger.domain.keys import from_us
        from fireledger.recurrence import format_instant

        tenant_id, actor, reason = key
        return DenialRow(tenant_id, actor, now, {
            "summary": True, "count": w.suppressed, "reason": reason,
            "first": format_instant(from_us(w.first_us)), "last": format_instant(from_us(w.last_us)),
            "by_request": dict(sorted(w.breakdown.items())),
            "written_individually": w.written,
        })

    def pending(self) -> int:
        """Refusals counted but not yet in the audit: those of open windows and those of summaries
        taken from their window whose append has not returned yet (a summary being written is still
        pending, so a caller that waits for 0 sees it in the audit)."""
        with self._lock:
            return self._unwritten + sum(w.suppressed for w in self._windows.values())

    # --- writing --------------------------------------------------------------------------------

    def write(self, rows: list[DenialRow]) -> None:
        """Append ``rows`` (blocking: call off the event loop). A failure is logged with the number of
        refusals it loses (type only, never content) and does not raise."""
        for i, r in enumerate(rows):
            try:
                self.store.trust.append_audit(r.tenant_id, r.actor, "denied", r.at_us, None, r.new)
            except Exception as err:   # the refusal stands; the failure to audit it is loud
                lost = sum(int(x.new.get("count", 1)) for x in rows[i:])
                log.error("could not audit %d denied request(s): %s", lost, type(err).__name__)
                self._settled(rows[i:])
                return
            self._settled((r,))

    def _settled(self, rows: Sequence[DenialRow]) -> None:
        """The summaries among ``rows`` are appended (or lost, logged): no longer pending."""
        done = sum(int(r.new["count"]) for r in rows if r.new.get("summary"))
        if done:
            with self._lock:
                self._unwritten -= done

    def flush(self, *, everything: bool = False) -> int:
        """Write the summaries of windows that ended (every open one when ``everything``); returns the
        refusals they count."""
        with self._lock:
            rows = self._take_ended(self.now_us(), everything=everything)
        self.write(rows)
        return sum(int(r.new["count"]) for r in rows)

    def close(self) -> None:
        """Stop the flusher and write every pending count (at process stop). Idempotent."""
        with self._lock:
            self._closed = True
            t = self._flusher
        self._stop.set()
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)
        self.flush(everything=True)

    def _ensure_flusher(self) -> None:
        """Start the flusher thread if none runs (caller holds the lock). It exits once nothing is
        pending, and is started again by the next suppressed refusal."""
        if self._closed or (self._flusher is not None and self._flusher.is_alive()):
            return
        self._stop.clear()
        t = threading.Thread(target=self._flush_loop, name="audit-denials", daemon=True)
        self._flusher = t
        t.start()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_every_s):
            self.flush()
            with self._lock:
                if not any(w.suppressed for w in self._windows.values()):
                    self._flusher = None
                    return


__all__ = ["FLUSH_EVERY_S", "MAX_KEYS", "PER_WINDOW", "WINDOW_S", "DenialLedger", "DenialRow"]
