#!/usr/bin/env bash
# usage: install_phases.sh TAG [BRANCH_DIR]  -> /tmp/ci7_TAG/{out.txt,py_times.txt,...}
# A clean clone of BRANCH_DIR (default /work/wt/ci7) into a fresh venv (this machine's python3),
# scripts/install.sh test with: each output line timestamped, bash xtrace (with
# ${EPOCHREALTIME}) into install.sh's child scripts, every $PYTHON call timed (GNU time),
# pip at normal verbosity (PIP_VERBOSE=1 against -q: "Processing"/"Downloading" lines);
# then check_imports and each linter timed, mypy twice (cold, then its cache warm).
set -uo pipefail
tag=$1; src=${2:-/work/wt/ci7}
T=/tmp/ci7_$tag
rm -rf "$T"; mkdir -p "$T"
git clone -q "$src" "$T/clone"
stamp() { python3 -u -c 'import sys,time
for l in sys.stdin: sys.stdout.write(f"{time.time():.3f} {l}")'; }
{
echo "commit $(git -C "$T/clone" rev-parse --short HEAD) start $(date -u +%FT%TZ)"; uptime
t0=$(date +%s.%N)
python3 -m venv "$T/venv"
t1=$(date +%s.%N); echo "venv made in $(echo "$t1 - $t0" | bc) s"
cat > "$T/py" <<PY
#!/bin/bash
exec /usr/bin/time -a -o $T/py_times.txt -f "%e wall %U user %S sys | %C" $T/venv/bin/python3 "\$@"
PY
chmod +x "$T/py"
. "$T/venv/bin/activate"
cd "$T/clone"
ccache -s > "$T/ccache_before.txt" 2>&1
s=$(date +%s.%N)
env SHELLOPTS=xtrace PS4='+ ${EPOCHREALTIME} ${BASH_SOURCE##*/}:${LINENO}: ' PYTHON="$T/py" PIP_VERBOSE=1 \
  CCACHE_LOGFILE="$T/ccache.log" bash scripts/install.sh test 2>&1; rc=$?
e=$(date +%s.%N)
ccache -s > "$T/ccache_after.txt" 2>&1
echo "install rc $rc wall $(echo "$e - $s" | bc) s"; uptime
for step in "scripts/check_imports.py" "scripts/lint.py ruff" "scripts/lint.py mypy" "scripts/lint.py mypy" "scripts/lint.py clang-format"; do
  /usr/bin/time -f "TIME %e wall %U user %S sys | $step" python3 $step > "$T/step.out" 2>&1; echo "rc $? $(tail -1 "$T/step.out")"
  grep TIME "$T/step.out"
done
uptime; echo "end $(date -u +%FT%TZ)"
} 2>&1 | stamp > "$T/out.txt"
