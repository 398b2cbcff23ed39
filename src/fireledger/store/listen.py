"""``LISTEN`` on a dedicated PostgreSQL connection: the engine-level wake-up between processes.

A :class:`ChannelListener` calls ``on_notify()`` once per notification received on its channel.
It is a hint, never the only path: a dropped connection is reopened after a pause (logged, no
payload), and whoever relies on it keeps a poll of its own as the backstop. Notifications are
delivered by PostgreSQL at commit only, so a wake-up never announces an uncommitted row.

Channels (each sent by the store, inside the transaction whose commit it announces):

* :data:`DEFINITIONS_CHANNEL` — the definitions counter moved (migration 0002): timing loops replan;
* :data:`FIRES_CHANNEL` — a timing commit inserted (or released) fires, payload their count
  (decision 0221): dispatchers claim now instead of at their idle poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fireledger.waker import Waker

from .engine import dead_peer_options

log = logging.getLogger("fireledger.store")

DEFINITIONS_CHANNEL = "fireledger_definitions"
FIRES_CHANNEL = "fireledger_fires"


class ChannelListener:
    """``LISTEN channel`` on a dedicated connection to ``url``; ``on_notify()`` per notification.
    ``listening`` is set while the ``LISTEN`` is in force; ``received`` counts notifications."""

    def __init__(self, url: str, on_notify: Callable[[], None], channel: str, *, what: str = "listener") -> None:
        self.url = url
        self.on_notify = on_notify
        self.channel = channel
        self.what = what
        self.received = 0
        self.listening = threading.Event()

    def run(self, stop: Waker) -> None:
        """Listen until ``stop`` is set (seen within about a second); reconnect after any error."""
        import psycopg

        while not stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                                     **dead_peer_options(self.url)) as conn:
                    conn.execute(f"LISTEN {self.channel}")
                    self.listening.set()
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            self.received += 1
                            self.on_notify()
            except Exception as exc:
                self.listening.clear()
                log.warning("%s: %s; reconnecting (the poll still runs)", self.what, exc)
                stop.wait(1.0)
        self.listening.clear()

    def start(self, name: str) -> Waker:
        """Run in a daemon thread named ``name``; returns the event that stops it (it never blocks a
        process's exit: it holds nothing but its connection)."""
        stop = Waker()   # a timed wait that returns under a faked clock (waker.py)
        threading.Thread(target=self.run, args=(stop,), name=name, daemon=True).start()
        return stop


__all__ = ["DEFINITIONS_CHANNEL", "FIRES_CHANNEL", "ChannelListener"]
