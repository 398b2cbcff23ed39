#!/usr/bin/env bash
# Make sure libfaketime is on this machine (the timing-clock-step fault scenario steps one process's
# clock with it: LD_PRELOAD, a live timestamp file, monotonic clock left alone). Installs Debian's
# `faketime` package when missing and prints the library's path.
set -euo pipefail
find_lib() {
  for f in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
    [ -e "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}
if ! find_lib >/dev/null; then
  echo "ensure-faketime: installing Debian's faketime package" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq faketime >/dev/null
fi
find_lib
