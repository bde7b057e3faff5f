#!/usr/bin/env bash
# Quick start 1/2: set up, then run the demo study end to end on the CPU
# (tiny base model built locally -> 8 cells trained and evaluated -> tables, figures, report.html):
# one Snakemake run, the base model's SFT progress printed while it builds.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONDONTWRITEBYTECODE  # cache the bytecode of what the jobs import (scripts/setup.sh installs with --no-compile)
bash scripts/setup.sh
. .venv/bin/activate
ARGS=("$@")  # extra snakemake arguments
# packed cells (docs/packed.md): compatible cells train 4 to a job; on the CPU twin of this study the
# packed study took 0.60x the solo one's wall time at equal held-out accuracy. LORARL_DEMO_PACK=1: one job per cell.
PACK=(--config "pack=${LORARL_DEMO_PACK:-4}")
start=$(date +%s)
# one Snakemake run: the base's evaluation beside the training packs, each cell's evaluation and diagnosis as
# soon as its pack ends; each job is named as it finishes, the base model's SFT progress shows while it builds
# and the study's progress (cells, steps, ETA) every `progress_every` seconds (lorarl/pipeline/progress/console.py)
snakemake all "${PACK[@]}" ${ARGS[@]+"${ARGS[@]}"}
echo "[demo] finished in $(( $(date +%s) - start ))s | tables, figures, report.html"
echo "[demo] table:   results/demo/tables/summary.md (with intervals: results/demo/tables/stats.md)"
echo "[demo] figures: results/demo/figures/"
echo "[demo] report:  results/demo/report.html (one self-contained page; open it in a browser)"
echo "[demo] browse:  mlflow ui --backend-store-uri sqlite:///results/mlflow.db"
cat results/demo/tables/stats.md
