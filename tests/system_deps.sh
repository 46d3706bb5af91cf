#!/usr/bin/env bash
# What `make test` needs from the system, beyond the Python packages in .venv: Debian's Chromium
# for the real-browser check of the book, and Debian's python3-simgrid (3.32) for the SimGrid
# cross-check of the fabric model. Installed here when this user may (root with apt-get);
# otherwise one line names the command, before any test runs.
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
compgen -G "/usr/lib/python3/dist-packages/simgrid.cpython-*.so" >/dev/null || missing+=(python3-simgrid)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "Installing ${missing[*]} with apt-get (needed by make test)..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "make test needs ${missing[*]}: run 'sudo apt-get install -y ${missing[*]}' (Debian/Ubuntu), then make test again." >&2
  exit 1
fi
