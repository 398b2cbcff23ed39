"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Tests deliver to loopback sinks: the operator's switch for private targets (DESIGN.md §4) is on for
# the suite; tests of the egress guard and URL checks pass an explicit policy instead.
os.environ.setdefault("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")

# One state directory for the run (never the checkout's ./.fireledger): its key-encryption key, made
# as `fireledger init` makes it, is shared by in-process stores and the services tests start
# (tests/e2e.py); a test that needs its own state passes FIRELEDGER_STATE_DIR explicitly.
import atexit
import shutil
import tempfile
from pathlib import Path

if not os.environ.get("FIRELEDGER_STATE_DIR"):
    _state_root = tempfile.mkdtemp(prefix="fireledger-test-state-")
    atexit.register(shutil.rmtree, _state_root, True)
    from e2e import use_state_dir

    use_state_dir(Path(_state_root) / "state")

from pgserver import PgServer, pg_server_from_env


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole run (``FIRELEDGER_TEST_PG_URL`` or a throwaway one).

    ``pg_server.url`` is an admin URL; ``pg_server.new_database()`` gives each test its own empty
    database.
    """
    with pg_server_from_env() as server:
        yield server
