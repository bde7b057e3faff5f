#!/usr/bin/env bash
# Where there is network: write the wheels a GPU node with no network needs (lorarl/wheelhouse.py).
#   bash scripts/wheelhouse.sh --target-freeze node-freeze.txt --python 3.12 --out wheelhouse
# node-freeze.txt: `python3 -m pip freeze` run on the node (what it already has; torch is always the node's).
# Then on the node: bash wheelhouse/install.sh && python -m lorarl.gpucheck --minutes 8 --out gpucheck
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null   # lorarl installed here: its installed versions are the ones shipped
exec .venv/bin/python -m lorarl.wheelhouse "$@"
