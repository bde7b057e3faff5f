#!/usr/bin/env bash
# On a GPU node with no network, in a checkout of lorarl: install from a wheelhouse (scripts/wheelhouse.sh),
# then run the acceptance run. The node's `pip freeze` (before the install) and nvidia-smi go to OUT too.
#   bash scripts/gpucheck_node.sh WHEELHOUSE OUT [gpucheck arguments, e.g. --minutes 8]
# If the resolving install refuses (a package the node has at a version a dependent refuses, and no wheel of
# it in the wheelhouse), it says so and installs the wheels over the node's packages in a folder of their own
# (pip --target, first on PYTHONPATH), as a last resort; OUT/install.log keeps both attempts.
set -uo pipefail
wh=${1:?wheelhouse folder}; out=${2:?output folder}; shift 2
py=${PYTHON:-python3}
mkdir -p "$out"
"$py" -m pip freeze > "$out/node-freeze.txt" 2>/dev/null
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
if ! PYTHON=$py bash "$wh/install.sh" > "$out/install.log" 2>&1; then
  echo "[gpucheck_node] the resolving install refused (see $out/install.log); installing the wheels apart" | tee -a "$out/install.log"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/lorarl-site "$wh"/*.whl >> "$out/install.log" 2>&1 || exit 1
  export PYTHONPATH=/tmp/lorarl-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
work=${GPUCHECK_WORK:-/tmp/lorarl-gpucheck}
"$py" -m lorarl.gpucheck --out "$work" "$@" 2>&1 | tee "$out/gpucheck.log"
rc=${PIPESTATUS[0]}
cp "$work/gpucheck.md" "$work/gpucheck.json" "$out/" 2>/dev/null
# the checks' logs and every job's own logs (a doctor job killed at the budget leaves only those)
tar czf "$out/logs.tgz" -C "$work/work" logs $(cd "$work/work" 2>/dev/null && find results -type d -name logs 2>/dev/null) 2>/dev/null
exit "$rc"
