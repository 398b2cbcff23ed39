"""PostgreSQL backups you have restored (issue 16 item 4; decision 0190): a thin wrapper over the
server's own tools, never a re-implementation of them.

* **Backup.** :func:`backup_postgres` runs ``pg_basebackup`` (the binaries of the server's major
  version, found as the tests find them: ``/usr/lib/postgresql/<major>/bin``, else the newest there,
  else ``PATH``) with ``-X stream`` (the WAL that makes the copy consistent travels with it) and
  ``--checkpoint=fast`` into ``<DIR>/fireledger-pg-<UTC time>/base`` in tar (gzip) or plain format;
  then writes ``manifest.json`` beside it — last, so a directory without one is an unfinished backup.
  The manifest holds the fireledger schema version, the start and end time, the server's version and
  the tool's; never a password.
* **Restore.** :func:`restore_postgres` unpacks a backup into a new, empty data directory (mode
  0700; handed to the ``postgres`` OS user when run as root: PostgreSQL never runs as root), checks
  it with ``pg_verifybackup`` against the backup's own ``backup_manifest`` (files and WAL), and
  appends to ``postgresql.auto.conf``: ``port`` when given, ``archive_mode = off`` (a restored copy
  must not write into the archive of the server it came from), and with a WAL archive
  ``restore_command`` (+ ``recovery_target_time`` and ``recovery_target_action = 'promote'``) and a
  ``recovery.signal``. Starting the server and checking the store (``fireledger audit verify``,
  ``fireledger due-index rebuild``) are the operator's next steps (docs/operations.md).

Problems a caller can act on raise :class:`PgBackupError` whose message starts with the option
(``--to-pgdata: …``); a tool that fails is reported with the end of its output
(which never holds a payload: only file names and server messages).
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from fireledger.errors import FireledgerError
from fireledger.settings import process_env

MANIFEST = "manifest.json"
KIND = "fireledger-postgresql-base-backup"
FORMATS = ("tar", "plain")
PG_OS_USER = "postgres"


class PgBackupError(FireledgerError, ValueError):
    """A PostgreSQL backup or restore problem; the message starts with the option it concerns."""


def pg_bin_dir(major: int | None, tool: str = "pg_basebackup") -> Path:
    """The directory of the PostgreSQL client ``tool``: ``/usr/lib/postgresql/<major>/bin`` when it
    holds it, else the newest ``/usr/lib/postgresql/*/bin`` that does, else ``PATH``;
    ``ReplicationError`` naming ``--db`` when there is none."""

    def version(p: str) -> tuple[int, ...]:
        m = re.search(r"/postgresql/([\d.]+)/bin", p)
        return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    if major is not None:
        found.insert(0, f"/usr/lib/postgresql/{major}/bin")
    for d in found:
        if os.access(os.path.join(d, tool), os.X_OK):
            return Path(d)
    on_path = shutil.which(tool)
    if on_path:
        return Path(on_path).parent
    raise PgBackupError(f"--db: the PostgreSQL tool {tool} is not installed (Debian: postgresql-client-"
                           f"{major or 'NN'}); put it on PATH")


def _run(argv: list[str], field: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env={**process_env(), **env} if env else None)
    except subprocess.TimeoutExpired:
        raise PgBackupError(f"{field}: {Path(argv[0]).name} did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise PgBackupError(f"{field}: {Path(argv[0]).name} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def _safe_url(url: str) -> str:
    """``url`` without its password (for the manifest and messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def _password_apart(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its password, and the password as ``PGPASSWORD`` for the child's environment
    (a password on a command line is visible to every user in the process list)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, {}
    netloc = parts.netloc.replace(f":{parts.password}@", "@", 1)
    return parts._replace(netloc=netloc).geturl(), {"PGPASSWORD": unquote(parts.password)}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def server_facts(url: str) -> dict[str, Any]:
    """The server's version and the store's schema version (the store must be this program's)."""
    import psycopg

    from fireledger.store import SchemaError, Store, StoreError

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            row = conn.execute("SELECT current_setting('server_version'), "
                               "current_setting('server_version_num')::int").fetchone()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PgBackupError(f"--db: cannot connect to {_safe_url(url)} ({first})") from None
    assert row is not None
    try:
        store = Store.open(url, migrate=False)
    except (SchemaError, StoreError) as exc:
        raise PgBackupError(f"--db: not a fireledger store at the current schema ({exc})") from None
    try:
        schema = store.schema_version()
    finally:
        store.close()
    return {"server_version": str(row[0]), "server_version_num": int(row[1]), "schema_version": schema}


def backup_postgres(url: str, folder: Path, fmt: str = "tar", timeout_s: float = 6 * 3600,
                    facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Back up the whole PostgreSQL cluster behind ``url`` (a role with REPLICATION) into a new
    ``folder/fireledger-pg-<UTC>`` (see the module docstring); returns the manifest (with ``path``).
    ``facts``: :func:`server_facts` of ``url`` when the caller has them already."""
    if fmt not in FORMATS:
        raise PgBackupError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    facts = facts or server_facts(url)
    bin_dir = pg_bin_dir(facts["server_version_num"] // 10000)
    out = folder / f"fireledger-pg-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}"
    out.mkdir(mode=0o700, parents=True)
    started = _now()
    bare_url, env = _password_apart(url)
    argv = [str(bin_dir / "pg_basebackup"), "-d", bare_url, "-D", str(out / "base"), "-X", "stream",
            "--checkpoint=fast", "--no-password", "-l", f"fireledger {started}"]
    argv += ["-Ft", "-z"] if fmt == "tar" else ["-Fp"]
    try:
        _run(argv, "--db", timeout_s, env)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    manifest = {"kind": KIND, "format": fmt, "wal": "stream", "started_at": started, "finished_at": _now(),
                "schema_version": facts["schema_version"], "server_version": facts["server_version"],
                "server_version_num": facts["server_version_num"],
                "pg_basebackup": _run([str(bin_dir / "pg_basebackup"), "--version"], "--db", 30).strip(),
                "source": _safe_url(url)}
    tmp = out / (MANIFEST + ".partial")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out / MANIFEST)
    return {**manifest, "path": str(out)}


def read_manifest(source: Path) -> dict[str, Any] | None:
    """The manifest of a PostgreSQL backup directory, or None when ``source`` is not one."""
    path = source / MANIFEST
    if not source.is_dir() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == KIND else None


@dataclass(frozen=True)
class PgRestorePlan:
    """What :func:`restore_postgres` does, all checked before anything is written."""

    source: Path
    manifest: dict[str, Any]
    pgdata: Path
    port: int | None = None
    wal_archive: Path | None = None
    target_time: str | None = None


def plan_restore(source: Path, pgdata: Path, port: int | None, wal_archive: str | None,
                 target_time: str | None) -> PgRestorePlan:
    """Check the restore's input; ``ReplicationError`` naming the option otherwise."""
    manifest = read_manifest(source)
    if manifest is None:
        raise PgBackupError(f"--from: {source} is not a fireledger PostgreSQL backup (no {MANIFEST}: "
                               "an unfinished backup, or another kind)")
    if manifest.get("format") not in FORMATS or not (source / "base").is_dir():
        raise PgBackupError(f"--from: {source}/base is missing or the format is unknown")
    if pgdata.exists() and (not pgdata.is_dir() or any(pgdata.iterdir())):
        raise PgBackupError(f"--to-pgdata: {pgdata} exists and is not an empty directory")
    if port is not None and not 1 <= port <= 65535:
        raise PgBackupError(f"--port: {port} is out of range 1-65535")
    archive = None
    if wal_archive is not None:
        archive = Path(wal_archive).resolve()
        if not archive.is_dir():
            raise PgBackupError(f"--wal-archive: {archive} is not a directory")
        if "'" in str(archive):
            raise PgBackupError(f"--wal-archive: {archive} holds a quote; use a plainer path")
    if target_time is not None:
        if archive is None:
            raise PgBackupError("--recovery-target-time: needs --wal-archive (replay stops at that time)")
        try:
            parsed = datetime.fromisoformat(target_time.replace("Z", "+00:00"))
        except ValueError:
            raise PgBackupError(f"--recovery-target-time: {target_time!r} is not an ISO 8601 time") from None
        if parsed.tzinfo is None:
            raise PgBackupError(f"--recovery-target-time: {target_time!r} needs an offset (e.g. Z)")
        target_time = parsed.isoformat()
    return PgRestorePlan(source, manifest, pgdata.resolve(), port, archive, target_time)


def _unpack(plan: PgRestorePlan) -> None:
    base, data = plan.source / "base", plan.pgdata
    if plan.manifest["format"] == "plain":
        shutil.copytree(base, data, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("backup_manifest"))
        return
    others = sorted(p.name for p in base.glob("*.tar*") if not p.name.startswith(("base.tar", "pg_wal.tar")))
    if others:   # one archive per tablespace: fireledger creates none; restore those by hand
        raise PgBackupError(f"--from: the backup holds tablespaces ({', '.join(others)}); restore it with "
                            "PostgreSQL's documented steps")
    for name, into in (("base.tar", data), ("pg_wal.tar", data / "pg_wal")):
        names = (base / f"{name}{ext}" for ext in (".gz", "", ".lz4", ".zst"))
        archive = next((p for p in names if p.exists()), None)
        if archive is None:
            raise PgBackupError(f"--from: {base} has no {name}[.gz]")
        into.mkdir(mode=0o700, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")


def _recovery_conf(plan: PgRestorePlan) -> list[str]:
    lines = ["", f"# fireledger restore {_now()} from {plan.source}",
             "archive_mode = off   # a restored copy must not write into its source's archive"]
    if plan.port is not None:
        lines.append(f"port = {plan.port}")
    if plan.wal_archive is not None:
        lines.append(f"restore_command = 'cp \"{plan.wal_archive}/%f\" \"%p\"'")
        if plan.target_time is not None:
            lines += [f"recovery_target_time = '{plan.target_time}'", "recovery_target_action = 'promote'"]
    return lines


def restore_postgres(plan: PgRestorePlan, timeout_s: float = 6 * 3600) -> dict[str, Any]:
    """Unpack, verify and configure (see the module docstring); on a failure the new directory is
    removed again. Returns a summary for the command's output."""
    created = not plan.pgdata.exists()
    plan.pgdata.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        try:
            _unpack(plan)
        except (OSError, tarfile.TarError) as exc:
            raise PgBackupError(f"--from: cannot unpack {plan.source} into {plan.pgdata} ({exc})") from None
        bin_dir = pg_bin_dir(int(plan.manifest.get("server_version_num", 0)) // 10000 or None, "pg_verifybackup")
        _run([str(bin_dir / "pg_verifybackup"), "-q", "-m", str(plan.source / "base" / "backup_manifest"),
              str(plan.pgdata)], "--from", timeout_s)
        conf = plan.pgdata / "postgresql.auto.conf"
        with open(conf, "a") as f:
            f.write("\n".join(_recovery_conf(plan)) + "\n")
        if plan.wal_archive is not None:
            (plan.pgdata / "recovery.signal").touch()
        os.chmod(plan.pgdata, 0o700)
        owner = _hand_to_postgres(plan.pgdata)
    except BaseException:
        if created:
            shutil.rmtree(plan.pgdata, ignore_errors=True)
        else:
            for child in plan.pgdata.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        raise
    return {"restored": str(plan.pgdata), "from": str(plan.source), "source": "postgresql-base-backup",
            "schema_version": plan.manifest.get("schema_version"),
            "server_version": plan.manifest.get("server_version"), "port": plan.port,
            "wal_archive": str(plan.wal_archive) if plan.wal_archive else None,
            "recovery_target_time": plan.target_time, "owner": owner,
            "start": f"{pg_bin_dir(None, 'pg_ctl')}/pg_ctl -D {plan.pgdata} -l {plan.pgdata}/restored.log start"}


def _hand_to_postgres(pgdata: Path) -> str:
    """As root, give the directory to the ``postgres`` OS user (PostgreSQL refuses to run as root);
    otherwise it stays the invoking user's. Returns the owner's name."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    try:
        pw = pwd.getpwnam(PG_OS_USER)
    except KeyError:
        raise PgBackupError(f"--to-pgdata: run as root, but there is no {PG_OS_USER!r} OS user to hand "
                               "the data directory to; run restore as the user that runs PostgreSQL") from None
    for root, dirs, files in os.walk(pgdata):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)
    os.chown(pgdata, pw.pw_uid, pw.pw_gid)
    return PG_OS_USER
