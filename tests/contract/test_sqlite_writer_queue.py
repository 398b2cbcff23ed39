"""SQLite writers of several processes queue on ``<db>-writer.lock`` (decision 0218): a writer of
another process waits *in the kernel* on the file lock (seen in ``/proc/locks``, not in SQLite's
sleeping busy handler) and proceeds once the holder commits, or once the holder is killed with
``kill -9``; the lock is released on every path and reads never take it. Real processes, real files;
counts, not timings."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from e2e import wait_until
from fireledger.store.engine import SqliteEngine
from fireledger.store.writerlock import SUFFIX, lock_path_for

CHILD = """
import sys
from fireledger.store.engine import SqliteEngine
engine = SqliteEngine(sys.argv[1])
name = sys.argv[2]
if name == "holder":
    with engine.write() as c:
        c.execute("INSERT INTO t VALUES ('holder')")
        print("held", flush=True)
        sys.stdin.readline()   # until the parent says so, or is killed
    print("released", flush=True)
else:
    print("ready", flush=True)
    with engine.write() as c:
        c.execute("INSERT INTO t VALUES (?)", (name,))
    print(f"done contended={engine.writer_queue.contended}", flush=True)
"""


def new_db(tmp_path: Path) -> tuple[str, SqliteEngine]:
    path = str(tmp_path / "q.db")
    engine = SqliteEngine(path)
    with engine.write() as c:
        c.execute("CREATE TABLE t (name TEXT NOT NULL)")
    return path, engine


def child(path: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, path, name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def waits_on_queue(pid: int, path: str) -> bool:
    """Whether process ``pid`` is blocked in the kernel on the ``flock`` of ``path``'s sidecar."""
    inode = os.stat(path + SUFFIX).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and "FLOCK" in fields:
            i = fields.index("FLOCK")
            if int(fields[i + 3]) == pid and int(fields[i + 4].rsplit(":", 1)[1]) == inode:
                return True
    return False


def names(engine: SqliteEngine) -> list[str]:
    with engine.read() as c:
        return sorted(str(r[0]) for r in c.execute("SELECT name FROM t").fetchall())


def test_a_writer_of_another_process_waits_on_the_file_lock_and_proceeds_after_the_commit(tmp_path):
    path, engine = new_db(tmp_path)
    waiter = child(path, "waiter")
    try:
        assert waiter.stdout is not None
        with engine.write() as c:
            c.execute("INSERT INTO t VALUES ('parent')")
            assert waiter.stdout.readline().strip() == "ready"
            wait_until(lambda: waits_on_queue(waiter.pid, path), 20, "the waiter blocked on the file lock")
            assert waiter.poll() is None
        out, _ = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 0
    assert out.strip() == "done contended=1"   # it waited once, in the kernel, then wrote
    assert names(engine) == ["parent", "waiter"]
    assert engine.writer_queue.contended == 0 and engine.writer_queue.acquired == 2
    engine.close()


def test_kill_9_of_the_holder_releases_the_queue_and_the_waiter_commits(tmp_path):
    path, engine = new_db(tmp_path)
    holder = child(path, "holder")
    done = threading.Event()

    def write_after() -> None:
        with engine.write() as c:
            c.execute("INSERT INTO t VALUES ('after')")
        done.set()

    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        writer = threading.Thread(target=write_after, daemon=True)
        writer.start()
        wait_until(lambda: waits_on_queue(os.getpid(), path), 20, "this process blocked on the file lock")
        assert not done.is_set()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        wait_until(done.is_set, 30, "the write after the holder's death")
        writer.join(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == -signal.SIGKILL
    assert names(engine) == ["after"]   # the killed holder's transaction rolled back
    assert engine.writer_queue.contended == 1
    engine.close()


def probe_free(path: str) -> bool:
    """Whether the sidecar can be locked right now through a descriptor of its own."""
    fd = os.open(path + SUFFIX, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_the_lock_is_released_on_an_error_is_reentrant_and_reads_never_take_it(tmp_path):
    path, engine = new_db(tmp_path)
    with pytest.raises(RuntimeError), engine.write() as c:
        c.execute("INSERT INTO t VALUES ('rolled back')")
        assert not probe_free(path)   # held inside the transaction
        raise RuntimeError("boom")
    assert probe_free(path)
    with engine.writer_queue.held(), engine.writer_queue.held():
        assert not probe_free(path)
    assert probe_free(path)
    fd = os.open(path + SUFFIX, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # another holder: a read still goes through at once
        assert names(engine) == []
    finally:
        os.close(fd)
    engine.close()


def test_without_a_usable_sidecar_sqlite_alone_queues_the_writers(tmp_path):
    assert lock_path_for(":memory:") is None and lock_path_for("") is None
    (tmp_path / f"q.db{SUFFIX}").mkdir()   # cannot be opened as a file
    path, engine = new_db(tmp_path)
    with engine.write() as c:
        c.execute("INSERT INTO t VALUES ('still written')")
    assert names(engine) == ["still written"]
    assert engine.writer_queue.acquired == 0 and engine.writer_queue.path is None
    engine.close()
