"""A job's recorded environment: read from the installed metadata, the same facts `pip freeze` prints."""

from __future__ import annotations

import subprocess
import sys

from lorarl.provenance import pip_freeze


def _pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        if "==" in line and not line.startswith(("-e", "#")):
            name, version = line.split("#")[0].strip().split("==", 1)
            out[name.lower().replace("_", "-")] = version
    return out


def test_the_recorded_environment_is_what_pip_freeze_says():
    ours = _pins(pip_freeze())
    pips = _pins(subprocess.run([sys.executable, "-m", "pip", "freeze", "--disable-pip-version-check"],
                                capture_output=True, text=True, check=True).stdout.splitlines())
    assert len(pips) > 50 and {k: v for k, v in ours.items() if k in pips} == pips
    assert {"torch", "transformers", "trl", "peft", "mlflow"} <= set(ours)
