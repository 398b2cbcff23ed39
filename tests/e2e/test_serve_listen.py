"""`--listen` is bound before any plane starts: an address in use is one line naming the flag (exit 2),
not a half-started process that logs a traceback and exits 3."""

from __future__ import annotations

import socket

import pytest

from e2e import cli

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("command", ["serve", "control"])
def test_an_address_in_use_is_refused_naming_listen(tmp_path, command):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        out = cli(command, "--db", f"sqlite:///{tmp_path}/fl.db", "--listen", f"127.0.0.1:{port}", check=False)
    finally:
        holder.close()
    assert out.returncode == 2, out.stderr
    assert f"--listen: '127.0.0.1:{port}'" in out.stderr
    assert "in use" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
