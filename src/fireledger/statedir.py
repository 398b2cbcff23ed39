"""Where the service keeps its state: one directory, never the working directory or the repository.

The state directory is ``FIRELEDGER_STATE_DIR`` (default ``./.fireledger/``), created with mode
0700. It holds, unless each is placed elsewhere explicitly:

* ``keys.json`` — the dispatch signing key ring (private Ed25519 keys; ``FIRELEDGER_KEYRING``
  overrides the path), and its ``keys.json.lock``;
* ``kek.key`` — the key-encryption key (``FIRELEDGER_KEK`` gives the key itself,
  ``FIRELEDGER_KEK_FILE`` another file);
* ``fireledger.db`` — the default SQLite store (``--db`` / ``FIRELEDGER_DB`` override it).

Contracts:

* :func:`default_db_url` is the one default of every command's ``--db``.
* A key file (key ring, KEK file) that group or others may access is refused: :func:`private_file_problem`
  returns the one-line error, naming the file and the ``chmod 600`` that fixes it. A state directory
  that group or others may access is refused the same way (``chmod 700``) whenever it is used.
* Nothing here creates a key: :func:`ensure_state_dir` creates only the directory. Keys are created
  by ``fireledger init`` (:func:`fireledger.security.envelope.create_kek`) — never silently.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fireledger.errors import FireledgerError

__all__ = ["DEFAULT_STATE_DIR", "STATE_DIR_ENV", "StateDirError", "default_db_url", "ensure_state_dir",
           "is_in_state_dir", "legacy_store_problem", "private_file_problem", "state_dir"]

STATE_DIR_ENV = "FIRELEDGER_STATE_DIR"
DEFAULT_STATE_DIR = "./.fireledger"
DB_NAME = "fireledger.db"


class StateDirError(FireledgerError, RuntimeError):
    """The state directory cannot be used (one line naming the directory and the fix)."""


def state_dir() -> Path:
    """The state directory (``FIRELEDGER_STATE_DIR``, default ``./.fireledger``); not created here."""
    from fireledger.settings import process_env

    # Read where it is used, not passed down: every command and the tests' e2e helper share this
    # default (the settings object carries the same value as ``Settings.state_dir``).
    return Path(process_env().get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def default_db_url() -> str:
    """The default store of every command: ``sqlite:///<state dir>/fireledger.db``."""
    return f"sqlite:///{state_dir() / DB_NAME}"


def _mode_problem(path: Path, what: str, want: int) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (f"{path}: the {what} is accessible by group/others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"fix it with: chmod {want:o} {path}")
    return None


def private_file_problem(path: str | os.PathLike[str], what: str) -> str | None:
    """None when ``path`` is missing or private (no group/other bits); else the one-line refusal,
    naming the file and the exact ``chmod 600`` that fixes it."""
    return _mode_problem(Path(path), what, 0o600)


def ensure_state_dir(path: Path | None = None) -> Path:
    """Create the state directory (mode 0700, parents as needed) when missing and return it.
    Raises :class:`StateDirError` when it exists but group or others may access it, or is not a
    directory."""
    d = path if path is not None else state_dir()
    if not d.exists():
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"{d}: cannot create the state directory ({type(exc).__name__}); "
                                f"set {STATE_DIR_ENV} to a writable place") from None
    if not d.is_dir():
        raise StateDirError(f"{d}: the state directory ({STATE_DIR_ENV}) is not a directory")
    problem = _mode_problem(d, "state directory", 0o700)
    if problem is not None:
        raise StateDirError(problem)
    return d


def legacy_store_problem(db: str, cwd: Path | None = None) -> str | None:
    """When ``db`` is the default store, it does not exist yet and ``./fireledger.db`` (the default of
    releases before the state directory) does: the one-line refusal naming both and the fix — a new,
    empty store beside the old one would silently stop every trigger."""
    if db != default_db_url():
        return None
    here = cwd if cwd is not None else Path(".")
    old = here / "fireledger.db"
    new = state_dir() / DB_NAME
    if new.exists() or not old.exists():
        return None
    return (f"--db: the default store is now {new}, but {old} (the default of earlier releases) exists: "
            f"move it (mv {old} {new}, with its -wal and -shm files, after stopping every process) "
            f"or pass --db sqlite:///{old}")


def is_in_state_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a file directly inside the state directory."""
    try:
        return Path(path).parent.resolve() == state_dir().resolve()
    except OSError:
        return False
