#!/usr/bin/env bash
# SimGrid for benchmarks/simulate.py (the flow-level large-scale simulation).
# Debian's python3-simgrid installs in seconds (PyPI's simgrid builds from source
# and needs pybind11<3). Its module is built for CPython 3.11 and lives in
# /usr/lib/python3/dist-packages; benchmarks/sim/simgrid_loader.py loads it from
# there for any 3.11 interpreter (pyenv, venv). No-op when already importable.
set -euo pipefail
py=${PYTHON:-python3}
if PYTHONPATH="$(dirname "$0")/.." $py -c "from benchmarks.sim import simgrid_loader as s; s.load()" 2>/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "env_simgrid.sh: apt-get install python3-simgrid"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq python3-simgrid >/dev/null 2>&1 || \
    { apt-get update -qq && apt-get install -y -qq python3-simgrid >/dev/null; }
else
  echo "env_simgrid.sh: not root or no apt-get: install python3-simgrid (or pip install simgrid) to run the simulation" >&2
fi
