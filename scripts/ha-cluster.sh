#!/usr/bin/env bash
# A pg_auto_failover cluster on one machine: a monitor, a primary and a synchronous standby, each
# its own data directory and port under HA_DIR. Used by the tests, `make falsify` and
# docs/operations.md ("High availability"), which also writes out the same steps for three machines.
#
#   scripts/ha-cluster.sh up       create (first time) or start the three nodes; wait until the monitor
#                                  reports one primary and one secondary; print the store URL
#   scripts/ha-cluster.sh status   the monitor's view (node, port, reported and assigned state) and the URL
#   scripts/ha-cluster.sh url      the multi-host URL fireledger uses (--db / FIRELEDGER_DB)
#   scripts/ha-cluster.sh switchover   a planned `pg_autoctl perform switchover` (primary and standby swap)
#   scripts/ha-cluster.sh down     stop every node and delete HA_DIR
#
# Settings (environment): HA_DIR (default /tmp/fireledger-ha), HA_HOST (127.0.0.1), HA_MONITOR_PORT
# (55430), HA_NODE1_PORT (55431), HA_NODE2_PORT (55432), HA_DB (fireledger), HA_TIMEOUT_S (180: the
# deadline of `up`), HA_FAST_FAILOVER (0; 1 tightens the monitor's health checks so that a lost node
# is failed over in ~5 s instead of pg_auto_failover's default ~20-30 s: tests and `make falsify`). pg_autoctl refuses to run as root: as root every pg_autoctl runs as the
# `postgres` OS user (created when missing), the way tests/pgserver.py runs PostgreSQL.
#
# Commits are synchronous on two nodes: with one standby in the replication quorum pg_auto_failover
# sets synchronous_standby_names on the primary (formation number_sync_standbys 0 — the only value
# a two-node formation accepts — means "ANY 1 of the quorum standbys"). When the standby is lost the
# monitor moves the primary to wait_primary and turns synchronous replication off (writes go on,
# asynchronously, until the standby is back): the declared trade of pg_auto_failover.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
HA_DIR="${HA_DIR:-/tmp/fireledger-ha}"
HA_HOST="${HA_HOST:-127.0.0.1}"
HA_MONITOR_PORT="${HA_MONITOR_PORT:-55430}"
HA_NODE1_PORT="${HA_NODE1_PORT:-55431}"
HA_NODE2_PORT="${HA_NODE2_PORT:-55432}"
HA_DB="${HA_DB:-fireledger}"
HA_TIMEOUT_S="${HA_TIMEOUT_S:-180}"
HA_FAST_FAILOVER="${HA_FAST_FAILOVER:-0}"
PG_USER=postgres

as_pg() {   # run a command as the postgres OS user when we are root, with the cluster's XDG dirs
  local envs=(XDG_CONFIG_HOME="$HA_DIR/xdg/config" XDG_DATA_HOME="$HA_DIR/xdg/data"
              XDG_RUNTIME_DIR="$HA_DIR/xdg/run" PATH="$BINDIR:$PATH" PGCONNECT_TIMEOUT=5)
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$PG_USER" -- env "${envs[@]}" "$@"
  else
    env "${envs[@]}" "$@"
  fi
}

monitor_uri() { echo "postgres://autoctl_node@$HA_HOST:$HA_MONITOR_PORT/pg_auto_failover?sslmode=disable"; }
store_url() {
  echo "postgresql://$PG_USER@$HA_HOST:$HA_NODE1_PORT,$HA_HOST:$HA_NODE2_PORT/$HA_DB?target_session_attrs=read-write&connect_timeout=2"
}

prepare() {
  BINDIR="$("$here/ensure-postgres.sh")"
  "$here/ensure-pg-auto-failover.sh" >/dev/null
  if [ "$(id -u)" -eq 0 ] && ! getent passwd "$PG_USER" >/dev/null; then
    useradd --system --no-create-home "$PG_USER"
  fi
  mkdir -p "$HA_DIR/xdg/config" "$HA_DIR/xdg/data" "$HA_DIR/xdg/run" "$HA_DIR/log" "$HA_DIR/sock"
  chmod 0700 "$HA_DIR/xdg/run"
  [ "$(id -u)" -eq 0 ] && chown -R "$PG_USER:" "$HA_DIR"
  return 0
}

running() {   # is the pg_autoctl supervisor of data directory $1 alive?
  local pidfile="$HA_DIR/$1.pid"
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start_node() {   # start_node NAME CREATE-ARGS...: `create … --run` the first time, `run` afterwards
  local name="$1"; shift
  running "$name" && return 0
  local cmd
  if [ -f "$HA_DIR/$name/PG_VERSION" ] && [ -d "$HA_DIR/xdg/config/pg_autoctl" ]; then
    cmd=(pg_autoctl run --pgdata "$HA_DIR/$name")
  else
    cmd=(pg_autoctl create "$@" --pgdata "$HA_DIR/$name" --pgctl "$BINDIR/pg_ctl" --hostname "$HA_HOST"
         --auth trust --no-ssl --run)
  fi
  # setsid: the supervisor outlives this script; its log is the node's log.
  as_pg setsid "${cmd[@]}" </dev/null >>"$HA_DIR/log/$name.log" 2>&1 &
  echo $! >"$HA_DIR/$name.pid"
}

psql_monitor() {
  as_pg "$BINDIR/psql" -X -A -t -q "$(monitor_uri)" -c "$1" 2>/dev/null
}

wait_for() {   # wait_for WHAT SQL-returning-t [NUDGE-SQL PORT]: poll until true or the deadline
  local what="$1" sql="$2" nudge="${3:-}" port="${4:-}" deadline=$((SECONDS + HA_TIMEOUT_S))
  local pidfile
  while [ "$(psql_monitor "$sql" || true)" != "t" ]; do
    for pidfile in "$HA_DIR"/*.pid; do   # a supervisor that exited will not get there: fail now
      if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "ha-cluster: $(basename "$pidfile" .pid) exited while waiting for $what; its log:" >&2
        tail -n 20 "$HA_DIR/log/$(basename "$pidfile" .pid).log" >&2 || true
        exit 1
      fi
    done
    if [ -n "$nudge" ]; then
      as_pg "$BINDIR/psql" -X -q "postgresql://$PG_USER@$HA_HOST:$port/postgres" -c "$nudge" >/dev/null 2>&1 || true
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "ha-cluster: $what not reached within ${HA_TIMEOUT_S}s; logs in $HA_DIR/log" >&2
      tail -n 20 "$HA_DIR"/log/*.log >&2 || true
      exit 1
    fi
    sleep 0.5   # polling interval, bounded by the deadline above
  done
}

SQL_MONITOR_UP="select true"
SQL_TWO_NODES="select count(*) = 2 from pgautofailover.node"
SQL_HEALTHY="select count(*) filter (where reportedstate = 'primary' and goalstate = 'primary') = 1
  and count(*) filter (where reportedstate = 'secondary' and goalstate = 'secondary') = 1
  from pgautofailover.node"

cmd_up() {
  prepare
  start_node monitor monitor --pgport "$HA_MONITOR_PORT" --listen "$HA_HOST"
  wait_for "the monitor" "$SQL_MONITOR_UP"
  if [ "$HA_FAST_FAILOVER" = 1 ]; then
    # Detect a lost node in ~5 s rather than pg_auto_failover's ~20-30 s (tests, `make falsify`).
    local setting args=()
    for setting in health_check_period=1000 health_check_timeout=1000 health_check_max_retries=1 \
                   health_check_retry_delay=500 node_considered_unhealthy_timeout=4000 primary_demote_timeout=5000; do
      args+=(-c "ALTER SYSTEM SET pgautofailover.${setting%%=*} = ${setting#*=}")
    done
    as_pg "$BINDIR/psql" -X -q "postgresql://$PG_USER@$HA_HOST:$HA_MONITOR_PORT/postgres" "${args[@]}" \
      -c "SELECT pg_reload_conf()" >/dev/null
  fi
  local node_args=(postgres --monitor "$(monitor_uri)" --dbname "$HA_DB" --username "$PG_USER"
                   --listen "$HA_HOST" --replication-quorum true)
  start_node node1 "${node_args[@]}" --name node1 --pgport "$HA_NODE1_PORT"
  # The second node registers once the first is known to the monitor (it becomes its standby).
  wait_for "the first node" "select count(*) >= 1 from pgautofailover.node where reportedstate in ('single', 'wait_primary', 'primary')"
  start_node node2 "${node_args[@]}" --name node2 --pgport "$HA_NODE2_PORT"
  wait_for "two nodes" "$SQL_TWO_NODES"
  # pg_autoctl's pg_basebackup waits for a spread checkpoint (minutes on an idle server): an
  # immediate CHECKPOINT on the primary makes the one in progress finish at once.
  wait_for "the standby's base backup" \
    "select count(*) = 1 from pgautofailover.node where reportedstate in ('catchingup', 'secondary')" \
    "CHECKPOINT" "$HA_NODE1_PORT"
  wait_for "primary + secondary" "$SQL_HEALTHY"
  store_url
}

cmd_status() {
  BINDIR="$("$here/ensure-postgres.sh")"
  if ! psql_monitor "$SQL_MONITOR_UP" >/dev/null; then
    echo "ha-cluster: no monitor answers on $HA_HOST:$HA_MONITOR_PORT (HA_DIR=$HA_DIR)" >&2
    exit 1
  fi
  echo "node	port	reported	assigned	lsn"
  psql_monitor "select nodename, nodeport, reportedstate, goalstate, reportedlsn from pgautofailover.node order by nodeid" \
    | tr '|' '\t'
  echo "url	$(store_url)"
}

cmd_down() {
  BINDIR="$("$here/ensure-postgres.sh")"
  local name pids=()
  for name in node2 node1 monitor; do
    if [ -f "$HA_DIR/$name/PG_VERSION" ] && running "$name"; then
      as_pg pg_autoctl stop --pgdata "$HA_DIR/$name" >/dev/null 2>&1 || true
      pids+=("$(cat "$HA_DIR/$name.pid")")
    fi
  done
  local deadline=$((SECONDS + 60)) pid
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  done
  for name in node2 node1 monitor; do   # a postmaster left behind (its supervisor was killed)
    if [ -f "$HA_DIR/$name/postmaster.pid" ]; then
      pid="$(head -n 1 "$HA_DIR/$name/postmaster.pid")"
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$HA_DIR"
}

case "${1:-}" in
  up) cmd_up ;;
  status) cmd_status ;;
  url) store_url ;;
  switchover)
    BINDIR="$("$here/ensure-postgres.sh")"
    as_pg pg_autoctl perform switchover --pgdata "$HA_DIR/monitor" --wait "$HA_TIMEOUT_S" >>"$HA_DIR/log/switchover.log" 2>&1
    wait_for "primary + secondary" "$SQL_HEALTHY" ;;
  down) cmd_down ;;
  *) echo "usage: $0 up|status|url|switchover|down   (HA_DIR=$HA_DIR)" >&2; exit 2 ;;
esac
