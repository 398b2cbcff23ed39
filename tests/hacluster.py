"""A pg_auto_failover cluster for tests and falsification scenarios: ``scripts/ha-cluster.sh`` in a
fresh directory on free ports (monitor, primary, synchronous standby), driven from Python.

``HaCluster.available()`` says whether pg_auto_failover is (or can be) installed here — the only
reason a test that needs the cluster may skip. ``up()`` stands the cluster up and returns the
multi-host URL; ``primary()`` / ``secondary()`` ask the monitor which node is which;
``lose_node(name)`` kills a node the way a machine is lost (``kill -9`` of its ``pg_autoctl``
supervisor, every process under it, and its postmaster, at once: a killed postmaster alone is
restarted by its own keeper, on the same node); ``rejoin()`` starts a lost node again (``up``: it
rejoins as the standby and catches up); ``reached(name, states, after)`` reads the monitor's event
log for when a node reported a state; ``down()`` stops everything and deletes the directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ha-cluster.sh"
ENSURE = ROOT / "scripts" / "ensure-pg-auto-failover.sh"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), deepest last."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


class HaCluster:
    """One cluster in its own directory on free ports (``scripts/ha-cluster.sh``)."""

    def __init__(self, base: Path | None = None, *, fast_failover: bool = True) -> None:
        # As root the directory must be reachable by the postgres user: under /tmp, not $TMPDIR.
        if base is None:
            parent = Path(tempfile.mkdtemp(prefix="fireledger-ha-", dir="/tmp"))
            parent.chmod(0o755)   # the postgres user creates the cluster directory inside it
            base = parent / "cluster"
        self.dir = base
        monitor, node1, node2 = _free_ports(3)
        self.ports = {"monitor": monitor, "node1": node1, "node2": node2}
        self.env = {**os.environ, "HA_DIR": str(self.dir), "HA_MONITOR_PORT": str(monitor),
                    "HA_NODE1_PORT": str(node1), "HA_NODE2_PORT": str(node2),
                    "HA_FAST_FAILOVER": "1" if fast_failover else "0"}
        self.url = ""

    @staticmethod
    def available() -> str | None:
        """None when pg_auto_failover is installed (installing it when missing), else the reason."""
        try:
            proc = subprocess.run([str(ENSURE)], capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"scripts/ensure-pg-auto-failover.sh could not run: {exc}"
        if proc.returncode != 0:
            return f"pg_auto_failover cannot be installed here: {proc.stderr.strip()[-500:]}"
        return None

    def _run(self, *args: str, timeout_s: float = 300) -> str:
        proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout_s, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ha-cluster.sh {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        return proc.stdout

    def up(self) -> str:
        self.url = self._run("up").strip().splitlines()[-1]
        return self.url

    def states(self) -> dict[str, tuple[str, str]]:
        """node name → (reported state, assigned state), as the monitor sees them."""
        out = {}
        for line in self._run("status", timeout_s=60).splitlines()[1:]:
            cols = line.split("\t")
            if len(cols) >= 4 and cols[0] != "url":
                out[cols[0]] = (cols[2], cols[3])
        return out

    def primary(self) -> str | None:
        for name, (reported, assigned) in self.states().items():
            if reported in ("primary", "wait_primary", "single") and assigned == reported:
                return name
        return None

    def secondary(self) -> str | None:
        for name, (reported, assigned) in self.states().items():
            if reported == "secondary" and assigned == reported:
                return name
        return None

    def node_url(self, name: str) -> str:
        """A URL of one data node (no ``target_session_attrs``: a standby answers read-only)."""
        return f"postgresql://postgres@127.0.0.1:{self.ports[name]}/fireledger?connect_timeout=5"

    def reached(self, name: str, states: tuple[str, ...], after: float) -> float | None:
        """When (wall clock) the monitor first logged ``name`` reporting one of ``states`` after
        ``after`` (pgautofailover.event); None if it has not."""
        import psycopg

        url = f"postgresql://autoctl_node@127.0.0.1:{self.ports['monitor']}/pg_auto_failover?connect_timeout=5"
        with psycopg.connect(url, autocommit=True) as c:
            row = c.execute("SELECT extract(epoch FROM min(eventtime)) FROM pgautofailover.event "
                            "WHERE nodename = %s AND reportedstate::text = ANY(%s) AND eventtime > to_timestamp(%s)",
                            (name, list(states), after)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def rejoin(self) -> None:
        """Start every node that is not running (``up``) and wait for a primary and a secondary."""
        self._run("up")

    def postmaster_pid(self, name: str) -> int:
        return int((self.dir / name / "postmaster.pid").read_text().splitlines()[0])

    def supervisor_pid(self, name: str) -> int:
        """The node's ``pg_autoctl`` supervisor (its pid file under the cluster's XDG runtime dir)."""
        found = list((self.dir / "xdg" / "run").rglob(f"{name}/pg_autoctl.pid"))
        if not found:
            raise RuntimeError(f"no pg_autoctl pid file for {name} under {self.dir}")
        return int(found[0].read_text().splitlines()[0])

    def lose_node(self, name: str) -> float:
        """``kill -9`` the node's supervisor, its descendants and its postmaster at once; returns the
        wall-clock time of the kill."""
        postmaster = self.postmaster_pid(name)
        supervisor = self.supervisor_pid(name)
        victims = [supervisor, *_children(supervisor), postmaster, *_children(postmaster)]
        killed_at = time.time()
        for pid in dict.fromkeys(victims):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return killed_at

    def kill_postmaster(self, name: str) -> float:
        """``kill -9`` the node's postmaster only (its keeper restarts it on the same node)."""
        killed_at = time.time()
        os.kill(self.postmaster_pid(name), signal.SIGKILL)
        return killed_at

    def switchover(self) -> None:
        self._run("switchover", timeout_s=180)

    def down(self) -> None:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, env=self.env, timeout=180, check=False)
        parent = self.dir.parent
        if parent.name.startswith("fireledger-ha-") and parent.exists() and not any(parent.iterdir()):
            parent.rmdir()
