#!/usr/bin/env bash
# Create a venv (default .venv, Python 3.11) and install lorarl with its test extra. Idempotent and
# quick when done. PYTHON=... picks the interpreter, VENV=... the venv folder (scripts/py312.sh builds
# a second one with Python 3.12 this way).
# torch comes first, pinned: here `pip install torch==2.13.0` takes the CPU wheel on local disk for
# Python 3.11; any other route (Python 3.12 included) pulls the CUDA build of the same version.
# --no-compile: no byte-compiling of every installed module (minutes of CPU on 2 cores, beside the tests);
# Python compiles the modules it imports on first use and caches them, unless PYTHONDONTWRITEBYTECODE is set:
# then every process compiles torch, transformers and TRL again (about 11 s of CPU more per process here),
# so scripts/test.sh and scripts/demo.sh unset it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
stamp=$VENV/.lorarl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q --no-compile torch==2.13.0
  python -m pip install -q --no-compile -e '.[test]'
  touch "$stamp"
fi
echo "[setup] lorarl ready in $VENV ($(python -c 'import sys, torch, trl, peft; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, trl {trl.__version__}, peft {peft.__version__}")'))"
