#!/usr/bin/env bash
# Quick start 1/2: set up, then run the demo study end to end on the CPU
# (tiny base model built locally -> 8 cells trained and evaluated -> tables, figures, report.html):
# the base model first (its SFT progress printed as it goes), then the rest in one Snakemake run.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONDONTWRITEBYTECODE  # cache the bytecode of what the jobs import (scripts/setup.sh installs with --no-compile)
bash scripts/setup.sh
. .venv/bin/activate
STUDY=experiments/demo.yaml
ARGS=("$@")  # extra snakemake arguments, passed to every call
# packed cells (docs/packed.md): compatible cells train 4 to a job; on the CPU twin of this study the
# packed study took 0.60x the solo one's wall time at equal held-out accuracy. LORARL_DEMO_PACK=1: one job per cell.
PACK=(--config "pack=${LORARL_DEMO_PACK:-4}")
start=$(date +%s)
stage() {  # run the workflow up to rule(s) "$@" (and what they need), then one progress line
  local t0 status
  t0=$(date +%s)
  snakemake all --until "$@" "${PACK[@]}" ${ARGS[@]+"${ARGS[@]}"}
  status=$(lorarl status "$STUDY" --watch --max-updates 1 | head -1 || true)
  echo "[demo] stage ${*} finished in $(( $(date +%s) - t0 ))s | ${status#* }"
}
# the base model (the first job, alone): its SFT progress every 15 s (lorarl/build_progress.py)
python -m lorarl.build_progress tiny-arith --every 15 > >(sed -u 's/^/[demo] /') &
watcher=$!
trap 'kill "$watcher" 2>/dev/null || true' EXIT
stage base_model
# then everything else in one run: the base model's evaluation beside the training packs, each cell's
# evaluation and diagnosis as soon as its pack ends; Snakemake names each job as it finishes
t0=$(date +%s)
snakemake all "${PACK[@]}" ${ARGS[@]+"${ARGS[@]}"}
echo "[demo] train, evaluate, diagnose, aggregate finished in $(( $(date +%s) - t0 ))s | tables, figures, report.html"
echo "[demo] finished in $(( $(date +%s) - start ))s"
echo "[demo] table:   results/demo/tables/summary.md (with intervals: results/demo/tables/stats.md)"
echo "[demo] figures: results/demo/figures/"
echo "[demo] report:  results/demo/report.html (one self-contained page; open it in a browser)"
echo "[demo] browse:  mlflow ui --backend-store-uri sqlite:///results/mlflow.db"
cat results/demo/tables/stats.md
