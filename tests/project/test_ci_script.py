"""scripts/test.sh's CPU table: each process writes bash's `times` at its end, and `cpu_s` turns that into the
user+sys CPU seconds of the process and everything it waited for (docs/contributing.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "scripts" / "test.sh").read_text()


def cpu_s_function() -> str:
    m = re.search(r"^cpu_s\(\) \{.*?^\}$", SCRIPT, re.S | re.M)
    assert m, "scripts/test.sh defines no cpu_s"
    return m.group(0)


def test_cpu_s_counts_what_a_process_waited_for(tmp_path: Path):
    burn = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.7: pass"
    script = f"""set -euo pipefail
cpu_dir={tmp_path}
{cpu_s_function()}
( rc=0; python3 -c '{burn}' || rc=$?; times >"$cpu_dir/main"; exit $rc )
echo "$(cpu_s main) $(cpu_s absent)"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seconds, absent = out.stdout.split()
    assert 1 <= int(seconds) <= 2 and absent == "?", out.stdout  # the child's 0.7 s of CPU, rounded; no file: ?


def test_every_process_in_the_table_writes_its_times():
    table = re.search(r"for p in ([a-z0-9 ]+); do printf .*cpu_s", SCRIPT)
    assert table, "scripts/test.sh prints no CPU table"
    names = table.group(1).split()
    assert names == ["main", "beside", "py312", "vllm", "alone"]
    for name in names:
        assert f'times >"$cpu_dir/{name}"' in SCRIPT, name


def test_every_test_path_the_ci_scripts_name_exists():
    """BESIDE, ALONE and the Python 3.12 subset name test modules by path: a moved or renamed module must not
    fall out of CI's runs silently (a missing path fails pytest only in the process that names it)."""
    named = {}
    for script in ("test.sh", "py312.sh"):
        text = (REPO / "scripts" / script).read_text()
        named |= {m: script for m in re.findall(r"\btests/[A-Za-z0-9_/]+(?:\.[a-z]+)?", text)}
    assert {"tests/project/test_pipeline.py", "tests/slurm"} <= set(named), sorted(named)
    missing = sorted(f"scripts/{script}: {path}" for path, script in named.items() if not (REPO / path).exists())
    assert missing == [], missing
