"""A throwaway PostgreSQL server for the test run.

``PgServer.start()`` runs ``initdb`` in a fresh temporary directory and starts ``postgres`` on
127.0.0.1 with a free TCP port (its unix socket lives inside the directory), trust authentication
for local connections, and durability switched off for speed (``fsync``, ``synchronous_commit``,
``full_page_writes``). Readiness is polled with a deadline. ``close()`` stops the server with
``pg_ctl stop -m immediate`` and deletes the directory.

As root (initdb refuses to run as root) the directory is handed to the ``postgres`` OS user
(created with ``useradd --system`` when missing) and the server binaries run through
``runuser -u postgres --``.

``PgServer.external(url)`` wraps an existing server instead (``FIRELEDGER_TEST_PG_URL``); the
databases it creates are dropped on close.

Each test gets isolation through ``new_database()``: a freshly created, empty database with a
unique name, returned as a URL. ``drop_databases_since(mark)`` drops the databases made
after ``created()`` returned ``mark`` (tests/conftest.py drops each test's own when the test ends):
the server then holds only the databases in use, and deleting its directory at the end of the run
does not unlink a few hundred databases' files at once (17 s of the last test's teardown before).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ENV_URL = "FIRELEDGER_TEST_PG_URL"
PG_USER = "postgres"
READY_TIMEOUT_S = 60.0
_REPO = Path(__file__).resolve().parent.parent


def find_bin_dir() -> Path:
    """Directory holding ``initdb``/``pg_ctl``/``postgres``; runs scripts/ensure-postgres.sh if needed."""

    def version_key(p: str) -> tuple[int, ...]:
        m = re.search(r"/postgresql/([\d.]+)/bin", p)
        return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version_key, reverse=True)
    for d in candidates:
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    script = _REPO / "scripts" / "ensure-postgres.sh"
    proc = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    out = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not out or not os.access(os.path.join(out[-1], "initdb"), os.X_OK):
        raise RuntimeError(
            f"PostgreSQL server binaries not found and {script} failed "
            f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    return Path(out[-1])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_pg_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", PG_USER], check=True, capture_output=True)
        return pwd.getpwnam(PG_USER)


def _with_db(url: str, dbname: str) -> str:
    """``url`` with its database replaced by ``dbname`` (URL or key=value conninfo)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


class PgServer:
    """A PostgreSQL server for tests: ``url`` (admin connection) and ``new_database()``."""

    def __init__(
        self,
        url: str,
        *,
        tmpdir: Path | None = None,
        bin_dir: Path | None = None,
        proc: subprocess.Popen[bytes] | None = None,
        as_user: list[str] | None = None,
    ) -> None:
        self.url = url
        self._tmpdir = tmpdir
        self._bin_dir = bin_dir
        self._proc = proc
        self._as_user = as_user or []
        self._owned = proc is not None
        self._created: list[str] = []
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._closed = False

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def external(cls, url: str) -> PgServer:
        """Use an already running server; checks that it answers."""
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute("select 1")
        return cls(url)

    @classmethod
    def start(cls, *, bin_dir: Path | None = None, max_connections: int = 200, extra_conf: str = "") -> PgServer:
        """initdb + start a private server; raises ``RuntimeError`` with the server log on failure.
        ``extra_conf``: lines appended to its postgresql.conf (e.g. ``archive_mode = on``)."""
        bin_dir = bin_dir or find_bin_dir()
        is_root = os.geteuid() == 0
        as_user: list[str] = []
        # As root, /tmp rather than $TMPDIR: the postgres user must be able to reach the directory.
        base = "/tmp" if is_root else None
        tmpdir = Path(tempfile.mkdtemp(prefix="fireledger-pg-", dir=base))
        try:
            data, sock = tmpdir / "data", tmpdir / "sock"
            sock.mkdir()
            if is_root:
                pw = _ensure_pg_user()
                for p in (tmpdir, sock):
                    os.chown(p, pw.pw_uid, pw.pw_gid)
                as_user = ["runuser", "-u", PG_USER, "--"]
            init = subprocess.run(
                [
                    *as_user,
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if init.returncode != 0:
                raise RuntimeError(f"initdb failed (exit {init.returncode}):\n{init.stdout}\n{init.stderr}")
            conf = (
                "\n# fireledger test server\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{sock}'\n"
                f"max_connections = {int(max_connections)}\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "shared_buffers = '64MB'\n"
                "max_prepared_transactions = 0\n"
                + extra_conf
            )
            with open(data / "postgresql.conf", "a") as f:
                f.write(conf)
            last_error = ""
            for _ in range(5):  # a free port can be taken between probing and binding: retry
                port = _free_port()
                server = cls._launch(bin_dir, data, tmpdir, port, as_user)
                if server is not None:
                    return server
                last_error = (tmpdir / "postgres.log").read_text(errors="replace")[-4000:]
                if "could not bind" not in last_error and "already in use" not in last_error:
                    break
            raise RuntimeError(f"PostgreSQL did not start; server log:\n{last_error}")
        except BaseException:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise

    @classmethod
    def _launch(
        cls, bin_dir: Path, data: Path, tmpdir: Path, port: int, as_user: list[str]
    ) -> PgServer | None:
        """Start postgres on ``port``; the ready server, or None if the process exited early."""
        log_path = tmpdir / "postgres.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C in the terminal must not kill it before teardown
            )
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        server = cls(url, tmpdir=tmpdir, bin_dir=bin_dir, proc=proc, as_user=as_user)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                return None
            try:
                with psycopg.connect(url, connect_timeout=2) as conn:
                    conn.execute("select 1")
                return server
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    server._stop_process()
                    raise RuntimeError(
                        f"PostgreSQL not ready after {READY_TIMEOUT_S:.0f}s: {exc}\n"
                        + log_path.read_text(errors="replace")[-4000:]
                    ) from None
            time.sleep(0.02)  # polling interval, bounded by the deadline above

    # ---- use ----------------------------------------------------------------------------------

    def new_database(self, prefix: str = "fl_test", template: str = "template0") -> str:
        """Create a database with a unique name and return its URL: empty, or a copy of the database
        ``template`` (which must have no open connection: PostgreSQL's rule for a template)."""
        if self._closed:
            raise RuntimeError("server is closed")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,30}", prefix):
            raise ValueError("prefix must be a short lower-case identifier")
        with self._lock:
            n = next(self._counter)
        name = f"{prefix}_{os.getpid()}_{n}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                          sql.Identifier(template)))
        with self._lock:
            self._created.append(name)
        return _with_db(self.url, name)

    def created(self) -> int:
        """How many databases ``new_database()`` has made so far: a mark for :meth:`drop_databases_since`."""
        with self._lock:
            return len(self._created)

    def drop_databases_since(self, mark: int) -> None:
        """Drop the databases made after :meth:`created` returned ``mark`` (``WITH (FORCE)``: a
        connection a test left open is ended)."""
        with self._lock:
            names, self._created = self._created[mark:], self._created[:mark]
        if names and not self._closed:
            with psycopg.connect(self.url, autocommit=True) as conn:
                for name in names:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def close(self) -> None:
        """Stop an owned server and delete its directory; on an external server, drop our databases."""
        if self._closed:
            return
        self._closed = True
        if self._owned:
            self._stop_process()
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            return
        with self._lock:
            names, self._created = self._created, []
        if names:
            with psycopg.connect(self.url, autocommit=True) as conn:
                for name in names:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                    )

    def _stop_process(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        assert self._bin_dir is not None and self._tmpdir is not None
        subprocess.run(
            [*self._as_user, str(self._bin_dir / "pg_ctl"), "stop", "-D", str(self._tmpdir / "data"),
             "-m", "immediate", "-w", "-t", "30"],
            capture_output=True,
            check=False,
        )
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PgServer(url={self.url!r}, owned={self._owned})"


@contextlib.contextmanager
def pg_server_from_env() -> Iterator[PgServer]:
    """The server for a test session: ``FIRELEDGER_TEST_PG_URL`` if set, else a private one."""
    url = os.environ.get(ENV_URL)
    server = PgServer.external(url) if url else PgServer.start()
    try:
        yield server
    finally:
        server.close()
