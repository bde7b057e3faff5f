#!/usr/bin/env bash
# Python 3.12 proof for CI: a second venv (.venv312) built by scripts/setup.sh with a 3.12 interpreter,
# then the install's imports and a fast subset of the tests on it: structure and import graph, study
# config, rewards, GRPO loss and tiny training steps, the pinned set.
# The interpreter: $PYTHON312, else python3.12 on PATH, pyenv's 3.12, Debian's /usr/bin/python3.12.
# Python 3.12 has no CPU torch wheel on the package index, so torch 2.13.0 comes as the CUDA build
# (about 3 GB with its nvidia-* wheels; it runs on the CPU like the CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
find_py312() {
  local c
  for c in ${PYTHON312:-} python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if "$c" -c 'import sys, venv, ssl; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      command -v "$c"; return 0
    fi
  done
  return 1
}
if ! PY=$(find_py312); then
  echo "[py312] no Python 3.12 interpreter found (tried \$PYTHON312, python3.12 on PATH, pyenv's" \
       "versions/3.12*, /usr/bin/python3.12): install one (pyenv install 3.12) or set PYTHON312=/path" >&2
  exit 1
fi
echo "[py312] interpreter: $PY"
PYTHON="$PY" VENV=.venv312 bash scripts/setup.sh
.venv312/bin/python -m pytest -p no:cacheprovider -q -m "not slow" \
  tests/project/test_structure.py tests/language/test_study.py tests/rewards/test_rewards.py tests/train/test_grpo.py tests/project/test_dependencies.py
