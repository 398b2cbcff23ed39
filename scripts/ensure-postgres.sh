#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl, postgres) are on this machine.
# Installs Debian's `postgresql` package when they are missing. The test run itself starts a
# throwaway server in a temporary directory (tests/pgserver.py); nothing here starts a service.
set -euo pipefail
find_bin() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  return 1
}
if ! find_bin >/dev/null; then
  echo "ensure-postgres: installing Debian's postgresql package" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq postgresql >/dev/null
fi
find_bin
