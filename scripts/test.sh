#!/usr/bin/env bash
# Quick start 2/2: set up, bring up a one-node Slurm cluster, run the whole test suite, tear down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/py312.sh       # second venv on Python 3.12: install + a fast subset of the tests
bash scripts/chromium.sh   # headless browser for the report page test (idempotent)
. .venv/bin/activate
bash scripts/postgres.sh          # PostgreSQL for tests/test_tracking_server.py (`lorarl tracking serve`)
bash tests/slurm/cluster.sh up
trap 'bash tests/slurm/cluster.sh down || true' EXIT
python -m pytest tests --durations=25 "$@"   # the 25 slowest: where to trim if CI grows
