#!/usr/bin/env bash
# Quick start 2/2: set up, bring up a one-node Slurm cluster, run the whole test suite, tear down.
# With no arguments the suite runs as two pytest processes side by side: BESIDE (the Slurm tests, which
# mostly wait on the scheduler and on requeues, then the two longest end-to-end modules) and the rest;
# BESIDE's report is printed after the main one. Arguments (`bash scripts/test.sh -x`, `-m "not slurm"`)
# go to one `pytest tests` run with every module.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/py312.sh       # second venv on Python 3.12: install + a fast subset of the tests
bash scripts/chromium.sh   # headless browser for the report page test (idempotent)
. .venv/bin/activate
bash scripts/postgres.sh          # PostgreSQL for tests/test_tracking_server.py (`lorarl tracking serve`)
bash tests/slurm/cluster.sh up
beside_log=$(mktemp)
beside_pid=
cleanup() {
  [ -n "$beside_pid" ] && kill "$beside_pid" 2>/dev/null || true
  bash tests/slurm/cluster.sh down || true
  rm -f "$beside_log"
}
trap cleanup EXIT
if [ $# -gt 0 ]; then
  python -m pytest tests --durations=25 "$@"
  exit
fi
BESIDE=(tests/slurm tests/test_faults.py tests/test_evaluation_pipeline.py)
python -m pytest -p no:cacheprovider "${BESIDE[@]}" --durations=10 >"$beside_log" 2>&1 &
beside_pid=$!
rc=0
python -m pytest tests "${BESIDE[@]/#/--ignore=}" --durations=25 || rc=$?   # the 25 slowest: where to trim if CI grows
beside_rc=0
wait "$beside_pid" || beside_rc=$?
beside_pid=
echo "======================= ${BESIDE[*]} (run beside the above) ======================="
cat "$beside_log"
[ "$rc" -eq 0 ] && [ "$beside_rc" -eq 0 ]
