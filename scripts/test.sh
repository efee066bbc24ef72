#!/bin/sh
# Install everything the test suite needs (the Debian `prometheus` server for the exporter's scrape test, and the
# project with its dev extras), then run the whole suite. Extra arguments go to pytest.
set -e
cd "$(dirname "$0")/.."
if ! command -v prometheus >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
python3 -m pip install -q -e '.[dev]'
python3 -m pytest "$@"
