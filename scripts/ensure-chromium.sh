#!/usr/bin/env bash
# Make sure Debian's Chromium is on this machine, for the console's browser test (Playwright drives
# it with executable_path=/usr/bin/chromium; never `playwright install`, which downloads a browser).
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
  echo "ensure-chromium: installing Debian's chromium package" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium >/dev/null
fi
test -x /usr/bin/chromium
echo /usr/bin/chromium
