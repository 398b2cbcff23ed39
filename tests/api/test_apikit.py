"""The API test harness sees the store changes it is meant to catch."""

import json
from pathlib import Path

from apikit import Api


def test_harness_snapshot_sees_changes(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        before = api.snapshot()
        _, s = api.tenant("acme")
        assert api.snapshot() != before
        assert json.loads(s.get("/healthz").text) == {"status": "ok"}
    finally:
        api.close()
