"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Tests deliver to loopback sinks: the operator's switch for private targets (DESIGN.md §4) is on for
# the suite; tests of the egress guard and URL checks pass an explicit policy instead.
os.environ.setdefault("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")

from pgserver import PgServer, pg_server_from_env


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole run (``FIRELEDGER_TEST_PG_URL`` or a throwaway one).

    ``pg_server.url`` is an admin URL; ``pg_server.new_database()`` gives each test its own empty
    database.
    """
    with pg_server_from_env() as server:
        yield server
