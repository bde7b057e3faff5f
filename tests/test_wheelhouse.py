"""`python -m lorarl.wheelhouse`: the wheels a machine with no network needs, minus what it has; and (slow) a fresh
venv that holds only torch and transformers installs everything else from a wheelhouse with no index, then
passes `python -m lorarl.gpucheck --cpu-smoke` (the acceptance run's CPU smoke runs there, not in the main venv)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lorarl.wheelhouse import BadInput, Target, plan, read_freeze, roots

ROOT = Path(__file__).resolve().parents[1]


def test_read_freeze_takes_pins_bare_names_and_direct_references():
    got = read_freeze("# a comment\nTorch==2.11.0\npeft\nfoo_bar @ file:///x/foo.whl\n-e git+https://x#egg=y\n\n")
    assert got == {"torch": "2.11.0", "peft": "", "foo-bar": ""}
    with pytest.raises(BadInput, match="expected `name==version`"):
        read_freeze("torch>=2\n")


def _plan(have: dict[str, str], role: str = "node"):
    return plan(roots(role), Target("3.12", "2.28"), {"torch": "2.11.0", **have})


def test_the_node_gets_what_it_lacks_and_never_torch():
    bare = _plan({})
    assert "torch" not in bare.ship and bare.provided["torch"] == "2.11.0"
    assert any("torch==2.13.0" in n and "2.11.0" in n for n in bare.notes)  # the pin against the node's torch, said
    for name in ("trl", "peft", "transformers", "mlflow-skinny", "sqlalchemy", "alembic", "submitit", "datasets"):
        assert name in bare.ship, name
    for name in ("snakemake", "psycopg2-binary", "mlflow", "flask", "gunicorn"):  # the submit host's, not a job's
        assert name not in bare.ship, name
    login = _plan({}, "login")
    assert {"snakemake", "psycopg2-binary", "mlflow"} <= set(login.ship)


def test_what_the_node_has_stays_unless_a_dependent_refuses_its_version():
    here = {n: v for n, v in _plan({}).ship.items()}
    have = {"transformers": here["transformers"], "numpy": here["numpy"], "peft": "", "pandas": "",
            "certifi": "2020.1.1"}
    p = _plan(have)
    assert "transformers" not in p.ship and "numpy" not in p.ship and "pandas" not in p.ship
    assert "peft" in p.ship  # version unknown on the node, and lorarl pins it exactly: shipped
    assert "certifi" in p.ship  # databricks-sdk asks a newer one than the node's (as on the H200 image)
    # a package the node provides is not walked: its own dependencies are the node's business
    assert "regex" in _plan({}).ship and "regex" not in p.ship and "typer" not in p.ship  # transformers' alone


def test_platform_tags_run_from_the_target_glibc_down():
    tags = Target("3.12", "2.28").platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_31_x86_64" not in tags


@pytest.mark.parametrize("args, err", [(["--python", "twelve"], "--python 'twelve'"),
                                       (["--role", "gpu"], "--role 'gpu'; allowed: node, login"),
                                       (["--target-freeze", "/nonexistent"], "no such file")])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, args, err):
    out = tmp_path / "wh"
    proc = subprocess.run([sys.executable, "-m", "lorarl.wheelhouse", "--out", str(out), *args],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and err in proc.stderr and not out.exists()


def _sh(cmd: list[str], **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture
def freed_node(tmp_path):
    """The node's venv (1.8 GB: torch) removed when the test ends: CI's other processes build venvs beside it."""
    yield tmp_path / "node"
    shutil.rmtree(tmp_path / "node", ignore_errors=True)


@pytest.mark.slow
def test_a_fresh_venv_installs_from_the_wheelhouse_with_no_index_and_passes_the_cpu_smoke(tmp_path, freed_node):
    venv, wh = freed_node, tmp_path / "wheelhouse"
    py = str(venv / "bin" / "python")
    _sh([sys.executable, "-m", "venv", str(venv)])
    import torch
    import transformers

    torch_version = torch.__version__.split("+")[0]  # this machine's CPU wheel: the node's own torch
    _sh([py, "-m", "pip", "install", "-q", "--no-compile", f"torch=={torch_version}",
         f"transformers=={transformers.__version__}"])
    (tmp_path / "freeze.txt").write_text(_sh([py, "-m", "pip", "freeze"]))
    glibc = platform.libc_ver()[1]
    py_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    _sh([sys.executable, "-m", "lorarl.wheelhouse", "--out", str(wh), "--python", py_version, "--glibc", glibc,
         "--target-freeze", str(tmp_path / "freeze.txt")], cwd=ROOT)
    manifest = json.loads((wh / "wheelhouse.json").read_text())
    assert "torch" not in manifest["shipped"] and "transformers" not in manifest["shipped"]
    assert manifest["total_bytes"] == sum(f.stat().st_size for f in wh.glob("*.whl"))
    env = {**os.environ, "PYTHON": py, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
    _sh(["bash", str(wh / "install.sh")], env=env)  # --no-index: nothing from the network
    assert _sh([py, "-c", "import lorarl, os; print(os.path.dirname(lorarl.__file__))"], cwd=tmp_path).strip() \
        .startswith(str(venv))  # the wheel's lorarl, not this checkout's
    from tests.support.gpucheck import check_cpu_smoke

    out = tmp_path / "gc"  # run in the checkout, as on a node (docs/gpus.md): its profiles and config
    proc = subprocess.run([py, "-m", "lorarl.gpucheck", "--cpu-smoke", "--minutes", "40", "--out", str(out)],
                          capture_output=True, text=True, timeout=2400, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    check_cpu_smoke(proc, out)
