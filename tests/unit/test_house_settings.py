"""Issue 14 (the house), item 5: one configuration object, read once at start-up (decision 0106).

(a) No module of the package reads ``os.environ``/``getenv`` except :mod:`fireledger.settings`;
    the modules that still reach the environment lazily (through ``settings.process_env()``) are
    exactly the listed ones, each with its reason.
(b) Every checked setting with a bad value raises ``SettingError`` (a ``ValueError``) naming it.
(c) ``fireledger serve`` with a bad value exits 2 with one line naming the variable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fireledger
from fireledger.settings import VARIABLES, SettingError, Settings

SRC = Path(fireledger.__file__).parent
ENV_READ = re.compile(r"\bos\.environ\b|\bgetenv\b|\bfrom os import\b.*\benviron\b|\bos\.environb\b")

#: Modules that still reach the environment below the entry points, through
#: ``fireledger.settings.process_env()``, and why (the entry points pass ``Settings`` instead).
LAZY_READERS = {
    "settings.py": "the one reader",
    "statedir.py": "the state directory default, shared by every command and by the tests' e2e helper",
    "stopping.py": "stop_timeout_s(env=None): a thin wrapper for tests and embedding",
    "service.py": "keyring_path()/dispatch_processes()/trusted_proxies() without settings: operator commands",
    "backfill.py": "max_fires_from_env(env=None): the CLI's backfill command and create_app() without settings",
    "retention.py": "retention_days()/archive_dir_for() without settings: the history CLI",
    "pgbackup.py": "the pg_basebackup child's environment plus PGPASSWORD (never on its command line)",
    "dispatch/lanes.py": "DispatchConfig.from_env(env=None): a thin wrapper for tests and embedding",
    "timing/loop.py": "TimingLoop(miss_threshold_us=None): tests build loops directly",
    "control/urls.py": "create_app(settings=None): tests set FIRELEDGER_ALLOW_PRIVATE_TARGETS per test",
    "control/dryrun.py": "create_app(settings=None): the miss threshold read per request",
    "control/httpproto.py": "max_connections(env=None): a thin wrapper (serve sets the cap from settings)",
    "control/console/__init__.py": "public_url_from_env(env=None): mount() without settings (tests)",
    "security/egress.py": "EgressPolicy.from_env(): the HTTP sender built without a policy (tests, embedding)",
    "security/envelope.py": "the KEK (FIRELEDGER_KEK / _KEK_FILE) is loaded by the store on first use",
    "security/limits.py": "per-tenant limits read per request by the definitions service",
    "cli/keys.py": "fireledger init: an operator command (an entry point) checks FIRELEDGER_KEK",
}


def _modules() -> list[tuple[str, str]]:
    return [(str(p.relative_to(SRC)), p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))]


def test_no_module_but_settings_reads_the_environment() -> None:
    readers = sorted(name for name, text in _modules() if ENV_READ.search(text) and name != "settings.py")
    assert readers == [], f"read os.environ/getenv outside fireledger/settings.py: {readers}"


def test_the_lazy_readers_are_exactly_the_listed_ones() -> None:
    lazy = {name for name, text in _modules() if "process_env(" in text}
    assert lazy == set(LAZY_READERS), (sorted(lazy - set(LAZY_READERS)), sorted(set(LAZY_READERS) - lazy))


def test_the_checker_sees_a_read() -> None:
    """The pattern is not vacuous: it matches the ways a module could read the environment."""
    for text in ('x = os.environ.get("A")', 'os.getenv("A")', "from os import environ, path", "os.environ['A']"):
        assert ENV_READ.search(text), text


def test_defaults_of_an_empty_environment() -> None:
    s = Settings.from_env({})
    assert (s.stop_timeout_s, s.backfill_max, s.history_retention_days) == (10.0, 1000, 90)
    assert s.dispatch_processes == min(len(os.sched_getaffinity(0)), 2)   # decision 0239
    assert (s.miss_threshold_us, s.declared_eps_us, s.log_level, s.trusted_proxies) == (60_000_000, 5000, "info", ())
    assert s.allow_private_targets is False and s.public_url is None and s.max_connections is None
    assert s == Settings()   # the dataclass defaults are the documented ones


def test_values_are_read() -> None:
    s = Settings.from_env({
        "FIRELEDGER_STOP_TIMEOUT_S": "2.5", "FIRELEDGER_DISPATCH_PROCESSES": "3", "FIRELEDGER_TRUSTED_PROXIES":
        "10.0.0.0/8, 127.0.0.1", "FIRELEDGER_LANE_CATCH_UP": "rate=5,concurrency=4", "FIRELEDGER_SHADOW": "0",
        "FIRELEDGER_METRICS_LISTEN": "127.0.0.1:9100", "FIRELEDGER_SESSION_TTL_S": "4", "FIRELEDGER_KEK": "k" * 44,
        "FIRELEDGER_ALLOW_PRIVATE_TARGETS": "1", "FIRELEDGER_MISS_THRESHOLD_S": "5",
    })
    assert s.stop_timeout_s == 2.5 and s.dispatch_processes == 3
    assert s.trusted_proxies == ("10.0.0.0/8", "127.0.0.1")
    assert s.lanes == {"catch-up": (True, 5.0, 4)} and s.shadow is False
    assert s.metrics_listen == ("127.0.0.1", 9100) and s.leases.session_ttl_s == 4.0
    assert s.allow_private_targets is True and s.miss_threshold_us == 5_000_000
    assert "k" * 44 not in repr(s)   # the KEK is never printed


def test_the_dispatch_config_comes_from_the_settings() -> None:
    from fireledger.dispatch.lanes import DispatchConfig

    env = {"FIRELEDGER_LANE_BACKFILL": "rate=inf", "FIRELEDGER_DISPATCH_CONCURRENCY": "64",
           "FIRELEDGER_OVER_QUOTA_SHARE": "0.25"}
    cfg = DispatchConfig.from_settings(Settings.from_env(env))
    assert cfg == DispatchConfig.from_env(env)
    assert (cfg.concurrency, cfg.over_quota_share, cfg.lane("backfill").rate) == (64, 0.25, None)
    assert cfg.lane("backfill").concurrency == DispatchConfig().lane("backfill").concurrency


BAD = [
    ("FIRELEDGER_STOP_TIMEOUT_S", "0"),
    ("FIRELEDGER_DECLARED_EPS_MS", "fast"),
    ("FIRELEDGER_LOG_LEVEL", "loud"),
    ("FIRELEDGER_TRUSTED_PROXIES", "10.0.0.1/8"),
    ("FIRELEDGER_PUBLIC_URL", "ftp://x"),
    ("FIRELEDGER_MAX_CONNECTIONS", "0"),
    ("FIRELEDGER_BACKFILL_MAX", "100001"),
    ("FIRELEDGER_MAX_TRIGGERS_PER_TENANT", "many"),
    ("FIRELEDGER_MAX_TARGETS_PER_TENANT", "0"),
    ("FIRELEDGER_MAX_PRINCIPALS_PER_TENANT", "-3"),
    ("FIRELEDGER_HISTORY_RETENTION_DAYS", "0"),
    ("FIRELEDGER_MISS_THRESHOLD_S", "never"),
    ("FIRELEDGER_TIMING_LEASES", "maybe"),
    ("FIRELEDGER_SHADOW", "perhaps"),
    ("FIRELEDGER_SHADOW_INTERVAL_S", "-1"),
    ("FIRELEDGER_METRICS_LISTEN", "9100"),
    ("FIRELEDGER_LEASE_TTL_S", "soon"),
    ("FIRELEDGER_SESSION_TTL_S", "0.6"),
    ("FIRELEDGER_CYCLE_S", "0"),
    ("FIRELEDGER_GUARD_S", "x"),
    ("FIRELEDGER_ROTATE_AFTER_S", "x"),
    ("FIRELEDGER_ROTATE_BATCH", "1.5"),
    ("FIRELEDGER_ORPHAN_GRACE_S", "0"),
    ("FIRELEDGER_REJOIN_AFTER_S", "-1"),
    ("FIRELEDGER_PRUNE_AFTER_S", "x"),
    ("FIRELEDGER_EPS_CEILING_US", "0"),
    ("FIRELEDGER_DISPATCH_PROCESSES", "65"),
    ("FIRELEDGER_DISPATCH_CONCURRENCY", "0"),
    ("FIRELEDGER_OVER_QUOTA_SHARE", "2"),
    ("FIRELEDGER_CONNECT_TIMEOUT_S", "inf"),
    ("FIRELEDGER_LANE_ON_TIME", "speed=9"),
    ("FIRELEDGER_LANE_CATCH_UP", "rate=0"),
    ("FIRELEDGER_LANE_BACKFILL", "concurrency=none"),
    ("FIRELEDGER_PG_CONNECT_TIMEOUT_S", "0"),
    ("FIRELEDGER_PG_STATEMENT_TIMEOUT_MS", "soon"),
    ("FIRELEDGER_REPLICA", "s3://bucket/prefix"),
    ("FIRELEDGER_REPLICA_SYNC_S", "0"),
    ("FIRELEDGER_TIMING_GATHER_S", "-0.01"),
    ("FIRELEDGER_TIMING_MAX_SLEEP_S", "0"),
    ("FIRELEDGER_DISPATCH_IDLE_S", "soon"),
    ("FIRELEDGER_DISPATCH_SETTLE_GATHER_S", "-1"),
    ("FIRELEDGER_VERIFICATION_VALIDITY_S", "4"),
    ("FIRELEDGER_REVERIFY_WINDOW_S", "soon"),
    ("FIRELEDGER_DNS_NAMESERVER", "resolver.example"),
]
#: Free-form values, checked where they are used (a path, a URL the receivers compare, module names,
#: the KEK, whose decoding names FIRELEDGER_KEK), or a switch where anything but "1" means off.
UNCHECKED = {"FIRELEDGER_STATE_DIR", "FIRELEDGER_KEK", "FIRELEDGER_KEK_FILE", "FIRELEDGER_KEYRING",
             "FIRELEDGER_ISSUER", "FIRELEDGER_HISTORY_ARCHIVE_DIR", "FIRELEDGER_INTERNAL_MODULES",
             "FIRELEDGER_ALLOW_PRIVATE_TARGETS"}


def test_every_setting_is_either_checked_here_or_listed_as_free_form() -> None:
    assert {name for name, _ in BAD} | UNCHECKED == set(VARIABLES)
    assert not {name for name, _ in BAD} & UNCHECKED


@pytest.mark.parametrize(("name", "value"), BAD, ids=[name for name, _ in BAD])
def test_a_bad_value_raises_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingError, match=rf"^{name}: ") as caught:
        Settings.from_env({name: value})
    assert isinstance(caught.value, ValueError)   # callers catching ValueError still do


def test_serve_with_a_bad_setting_exits_2_naming_it(tmp_path: Path) -> None:
    """A real process: the settings are checked before the store is opened or any plane starts."""
    env = {**os.environ, "FIRELEDGER_DECLARED_EPS_MS": "fast"}   # the run's state directory (conftest)
    r = subprocess.run([sys.executable, "-c", "from fireledger.cli import main; main()", "serve", "--db",
                        f"sqlite:///{tmp_path}/fl.db", "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "FIRELEDGER_DECLARED_EPS_MS" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "fl.db").exists()   # nothing was created
