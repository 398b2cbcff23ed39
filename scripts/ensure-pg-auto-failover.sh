#!/usr/bin/env bash
# Make sure pg_auto_failover is on this machine: `pg_autoctl` (Debian's pg-auto-failover-cli) and the
# monitor's extension for the installed PostgreSQL (postgresql-NN-auto-failover). Installs them with
# apt when missing, as scripts/ensure-postgres.sh does for the server binaries; prints the path of
# pg_autoctl. Nothing here starts a service: scripts/ha-cluster.sh does, in a directory of its own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bindir="$("$here/ensure-postgres.sh")"
major="$(basename "$(dirname "$bindir")")"
case "$major" in (*[!0-9]*|'') major="$("$bindir/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')";; esac
has_extension() {
  local sharedir
  sharedir="$("$bindir/pg_config" --sharedir 2>/dev/null)" || return 1
  [ -f "$sharedir/extension/pgautofailover.control" ]
}
if ! command -v pg_autoctl >/dev/null 2>&1 || ! has_extension; then
  echo "ensure-pg-auto-failover: installing Debian's postgresql-$major-auto-failover and pg-auto-failover-cli" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "postgresql-$major-auto-failover" pg-auto-failover-cli >/dev/null
fi
command -v pg_autoctl
