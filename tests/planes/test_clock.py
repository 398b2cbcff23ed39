"""Clock sources: the kernel bound or a declared one, and the PostgreSQL cross-check (real server)."""

from __future__ import annotations

import time

from fireledger.clock import CrossCheckedClock, FakeClock, SystemClock, kernel_error_bound
from fireledger.store import Store


def test_system_clock_declares_its_source_and_contains_now():
    c = SystemClock(declared_eps_us=3_000)
    synced, maxerror = kernel_error_bound()
    iv = c.now()
    t = time.time_ns() // 1000
    assert iv.earliest_us <= t <= iv.latest_us + 1_000
    assert iv.source == ("kernel" if synced else "declared")
    if not synced:
        assert iv.eps_us == 3_000            # an unknown bound is never treated as zero


def test_fake_clock_moves_only_when_told():
    c = FakeClock(1_000, eps_us=10)
    assert (c.now().earliest_us, c.now().latest_us) == (990, 1_010)
    c.advance(5)
    assert c.now().earliest_us == 995


def test_postgres_cross_check_against_a_real_server(pg_server):
    store = Store.open(pg_server.new_database(), migrate=True)
    try:
        c = CrossCheckedClock(SystemClock(declared_eps_us=1_000), store.server_time_us)
        iv = c.now()
        t = time.time_ns() // 1000
        assert iv.source == "declared+postgres" or iv.source == "kernel+postgres"
        assert iv.earliest_us <= t <= iv.latest_us + 5_000
        assert iv.eps_us < 100_000          # same host: offset ~0, round trip well under the ceiling
        assert abs(c.probe.offset_us) < 50_000 and c.probe.rtt_us > 0
    finally:
        store.close()


def test_an_offset_server_widens_the_interval_past_the_ceiling():
    """A node 2 s off the authority gets an interval that covers both clocks: it cannot fire early
    by either, and its ε (> 100 ms) makes the timing loop shed."""
    c = CrossCheckedClock(SystemClock(declared_eps_us=1_000), lambda: time.time_ns() // 1000 + 2_000_000)
    iv = c.now()
    t = time.time_ns() // 1000
    assert iv.latest_us >= t + 2_000_000 - 10_000 and iv.earliest_us <= t
    assert iv.eps_us > 100_000


def test_no_word_from_the_authority_means_no_claiming():
    def down() -> int:
        raise OSError("connection refused")

    c = CrossCheckedClock(SystemClock(declared_eps_us=1_000), down)
    iv = c.now()
    assert iv.source == "postgres-stale" and iv.eps_us > 100_000


def test_an_old_probe_starts_one_measurement_however_many_readings_ask():
    """Over a slow link a measurement takes a round trip; every reading in that time asks for one.
    Only one is in flight at a time (before: one thread per reading, a storm on a slow link)."""
    import threading

    calls: list[int] = []
    release = threading.Event()
    in_flight = threading.Semaphore(0)

    def slow_server() -> int:
        calls.append(1)
        if len(calls) > 1:            # the first (constructor) measurement answers at once
            in_flight.release()
            assert release.wait(10)
        return time.time_ns() // 1000

    c = CrossCheckedClock(SystemClock(declared_eps_us=1_000), slow_server, interval_s=0.0)
    for _ in range(200):
        c.now()
    assert in_flight.acquire(timeout=10)      # the background measurement started...
    assert len(calls) == 2                    # ...and it is the only one
    release.set()
    deadline = time.monotonic() + 10
    while c._measuring:                       # poll with a deadline: the measurement lands
        assert time.monotonic() < deadline
        time.sleep(0.01)   # poll with a deadline
    c.now()
    assert in_flight.acquire(timeout=10) and len(calls) == 3   # the next old reading measures again
