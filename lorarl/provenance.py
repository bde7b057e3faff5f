"""Per-cell provenance: what code, packages, machine and Slurm jobs produced a stage's outputs.

One JSON file per cell and stage, `results/<study>/<cell>/provenance/<stage>.json` (for the base
model: `results/models/.logs/<name>/provenance.json`), outside Snakemake's declared outputs so a
failed or rerun stage never loses it. It is appended to, never rewritten from scratch:

    {"stage": "train", "study": ..., "cell": ..., "config_hash": ...,
     "submissions": [                                  # one per `lorarl launch` (Snakemake run)
        {"submitted_at": ..., "invocation": <the `snakemake` run: the job's --invocation, else null>,
         "host": <submit host>, "executor": "slurm", "slurm": {...params},
         "job_id": "12", "git": {"sha": ..., "dirty": true, "diff": "blobs/<sha256>.diff",
         "untracked": [...]}, "pip_freeze": "blobs/<sha256>.txt", "python": ...,
         "attempts": [                                 # one per start of the job (requeues included)
            {"job_id": "12", "restart_count": 0, "host": ..., "gpu": "NVIDIA H100 80GB HBM3" | "cpu",
             "started_at": ..., "ended_at": ..., "outcome": "requeued" | "completed" | "failed: ..."}]}]}

The dirty diff (`git diff HEAD` plus every untracked text file as a new-file patch, so that
`git apply` on the SHA rebuilds the tree) and the `pip freeze` are stored once by content in
`blobs/` next to the JSON. `lorarl.jobids.job_ids(...)` lists every Slurm job id across requeues and reruns.
Writes take an flock on a sibling `.lock` file (launcher and job may write at the same time).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from lorarl.paths import pack_folder
from lorarl.gitrepo import REPO, code_state, git

from lorarl.jobids import read  # the reading side (ENV_PATH, job_ids: lorarl.jobids), shared with the trainer


def provenance_path(results_dir: str | Path, study: str | None, cell: str, stage: str) -> Path:
    """A job of no study builds a base model (``cell``: its recipe; lorarl.pipeline.jobs.stages: `for_study`)."""
    if study is None:
        return Path(results_dir) / "models" / ".logs" / cell / "provenance.json"
    return Path(results_dir) / str(study) / cell / "provenance" / f"{stage}.json"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _run(cmd: list[str], timeout: float = 60) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _untracked_patch(repo: str, name: str, max_bytes: int) -> str:
    path = Path(repo) / name
    try:
        if path.stat().st_size > max_bytes or b"\0" in path.read_bytes()[:8192]:
            return f"# untracked, not included (binary or over {max_bytes} bytes): {name}\n"
    except OSError:
        return ""
    # exits 1 when the files differ, which they always do here
    return git(repo, "diff", "--no-color", "--no-index", "--", "/dev/null", name, ok_codes=(0, 1)) or ""


def git_info(repo: str | Path = REPO, max_file_bytes: int = 512_000) -> dict[str, Any]:
    """HEAD sha, dirty flag, the dirty diff as text (tracked changes + untracked text files as new-file
    patches) and the untracked file names."""
    repo = str(repo)
    state = code_state(repo)  # sha and dirty as the MLflow tags and the report give them
    if state["sha"] is None:
        return {"sha": "unknown", "dirty": None, "diff": "", "untracked": []}
    untracked = state["untracked"]
    diff = state["diff"] + "".join(_untracked_patch(repo, name, max_file_bytes) for name in untracked)
    return {"sha": state["sha"], "dirty": state["dirty"], "diff": diff, "untracked": untracked}


def store_blob(folder: Path, text: str, suffix: str) -> str:
    """Content-addressed: the same diff or freeze across submissions is stored once. Returns the path
    relative to the provenance JSON."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / "blobs" / f"{digest}{suffix}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return f"blobs/{path.name}"


def pip_freeze() -> list[str]:
    """What `pip freeze` says of the interpreter the jobs run with (submitit uses sys.executable: this one), read
    in this process from the installed metadata: ``name==version`` per distribution, ``name @ URL`` for one
    installed from a URL or a local folder (PEP 610's direct_url.json; an editable install names its folder).
    Running `pip freeze` cost every launcher about 2 s of CPU (pip's own imports) for the same facts."""
    import json
    from importlib import metadata

    out, seen = [], set()
    for d in metadata.distributions():  # sys.path order: the first of a name is the one Python imports
        name = d.metadata["Name"]
        key = (name or "").lower().replace("_", "-")
        if not name or key in seen:
            continue
        seen.add(key)
        try:
            direct = json.loads(d.read_text("direct_url.json") or "null")
        except ValueError:
            direct = None
        if direct and direct.get("dir_info", {}).get("editable"):
            out.append(f"-e {direct['url']}  # {name}=={d.version}")
        elif direct and "archive_info" not in direct:  # a VCS or a local folder, not a wheel from an index
            out.append(f"{name} @ {direct['url']}")
        else:
            out.append(f"{name}=={d.version}")
    return sorted(out, key=str.lower)


def gpu_type() -> str:
    """The GPU(s) this process sees, e.g. 'NVIDIA H100 80GB HBM3 x2', or 'cpu'."""
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], timeout=30)
        names = [n.strip() for n in (out or "").splitlines() if n.strip()]
        if names:
            return names[0] if len(set(names)) == 1 and len(names) == 1 else f"{names[0]} x{len(names)}"
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        try:
            if torch.cuda.is_available():
                n = torch.cuda.device_count()
                return torch.cuda.get_device_name(0) + (f" x{n}" if n > 1 else "")
        except Exception:  # noqa: BLE001 - provenance must never fail a job
            pass
    return "cpu"


def slurm_env() -> dict[str, Any]:
    keys = {"SLURM_JOB_ID": "job_id", "SLURM_RESTART_COUNT": "restart_count", "SLURM_JOB_PARTITION": "partition",
            "SLURM_JOB_NODELIST": "nodelist", "CUDA_VISIBLE_DEVICES": "cuda_visible_devices"}
    out = {v: os.environ[k] for k, v in keys.items() if k in os.environ}
    if "job_id" in out:  # Slurm sets SLURM_RESTART_COUNT only once a job has been requeued
        out["restart_count"] = int(out.get("restart_count", 0))
    return out


@contextmanager
def _locked_doc(path: Path) -> Iterator[dict]:
    """Read-modify-write the JSON document at `path` under an exclusive flock; written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            doc = json.loads(path.read_text()) if path.exists() else {}
        except json.JSONDecodeError:
            doc = {"corrupt_previous": path.read_text(errors="replace")[:10000]}
        yield doc
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)


def update(path: str | Path, fn: Callable[[dict], None]) -> dict:
    with _locked_doc(Path(path)) as doc:
        fn(doc)
    return doc


def record_submission(path: str | Path, *, stage: str, study: str | None, cell: str, config_hash: str | None,
                      executor: str, slurm: dict | None, repo: str | Path = REPO, invocation: str | None = None) -> int:
    """At submit time (before the job exists): code (of the checkout `repo`), packages, submit host, and the
    `snakemake` run submitting it (``invocation``: the job's ``--invocation``; None by hand). Returns its index."""
    path = Path(path)
    git = git_info(repo)
    git["diff"] = store_blob(path.parent, git["diff"], ".diff") if git["diff"] else None
    entry = {"submitted_at": now(), "invocation": invocation, "host": socket.gethostname(),
             "executor": executor, "slurm": slurm or {}, "python": sys.executable, "cwd": os.getcwd(), "git": git,
             "pip_freeze": store_blob(path.parent, "\n".join(pip_freeze()) + "\n", ".txt"),
             "job_id": None, "attempts": []}
    box: dict[str, int] = {}

    def add(doc: dict) -> None:
        doc.update({"stage": stage, "study": study, "cell": cell})
        if config_hash:
            doc["config_hash"] = config_hash
        doc.setdefault("submissions", []).append(entry)
        box["index"] = len(doc["submissions"]) - 1

    update(path, add)
    return box["index"]


def record_job_id(path: str | Path, index: int, job_id: str, job_name: str | None = None) -> None:
    def add(doc: dict) -> None:
        sub = doc["submissions"][index]
        sub["job_id"] = str(job_id)
        if job_name:
            sub["job_name"] = job_name

    update(path, add)


def _submission_of(doc: dict, index: int | None) -> dict:
    subs = doc.setdefault("submissions", [])
    if index is None or index >= len(subs):
        subs.append({"submitted_at": None, "job_id": None, "attempts": []})
        return subs[-1]
    return subs[index]


def record_attempt_start(path: str | Path, index: int | None) -> None:
    """Inside the job, at every start (a requeued job starts again with SLURM_RESTART_COUNT + 1)."""
    env = slurm_env()
    attempt = {"started_at": now(), "host": socket.gethostname(), "pid": os.getpid(), "gpu": gpu_type(), **env}

    def add(doc: dict) -> None:
        sub = _submission_of(doc, index)
        if env.get("job_id") and not sub.get("job_id"):
            sub["job_id"] = env["job_id"]
        sub.setdefault("attempts", []).append(attempt)

    update(path, add)


def record_attempt_end(path: str | Path, index: int | None, outcome: str) -> None:
    def add(doc: dict) -> None:
        attempts = _submission_of(doc, index).setdefault("attempts", [])
        mine = [a for a in attempts if a.get("pid") == os.getpid() and "ended_at" not in a]
        if mine:
            mine[-1].update({"ended_at": now(), "outcome": outcome[:2000]})

    update(path, add)


def attempts(doc_or_path: dict | str | Path) -> list[dict]:
    doc = doc_or_path if isinstance(doc_or_path, dict) else read(doc_or_path)
    return [a for sub in doc.get("submissions", []) for a in sub.get("attempts", [])]


# --- reading the records back: the code each cell's jobs ran (the report and the study's MLflow run) ---

def _freeze_versions(text: str, packages: tuple[str, ...]) -> dict[str, str]:
    """`packages`' versions in a stored `pip freeze` (``name==v``, ``-e url  # name==v``, ``name @ url``)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        spec = line.split("#", 1)[1].strip() if line.startswith("-e ") and "#" in line else line.strip()
        name, sep, version = spec.partition("==")
        if not sep:
            name, version = spec.partition(" @ ")[0], spec.partition(" @ ")[2]
        key = name.strip().lower().replace("_", "-")
        if key in packages:
            found[key] = version.strip()
    return {p: found.get(p, "absent") for p in packages}


def submission_code(sub: dict, folder: Path, packages: tuple[str, ...]) -> dict[str, Any]:
    """What one submission ran: {"sha", "dirty", "diff_hash" (the stored diff's content hash, None when clean),
    "packages": {name: version}} from its record and its `pip freeze` blob next to the JSON."""
    git = sub.get("git") or {}
    diff = git.get("diff")
    freeze = sub.get("pip_freeze")
    try:
        text = (folder / freeze).read_text() if freeze else ""
    except OSError:
        text = ""
    return {"sha": git.get("sha", "unknown"), "dirty": git.get("dirty"),
            "diff_hash": Path(diff).stem if diff else None,
            "packages": _freeze_versions(text, packages) if text else {p: "unknown" for p in packages}}


def _state_key(state: dict) -> tuple:
    return state["sha"], state["dirty"], state["diff_hash"], tuple(sorted(state["packages"].items()))


def cell_code(results_dir: str | Path, study: str, cells: list[str], packages: tuple[str, ...]
              ) -> dict[str, list[dict]]:
    """Per cell, the distinct code states its jobs ran (each {sha, dirty, diff_hash, packages, stages}): every
    submission that started (an attempt recorded) in `<cell>/provenance/*.json` and in the packs that trained it
    (`.packs/*/provenance/pack.json`). An empty list: no job of the cell left a record (e.g. `lorarl run`)."""
    sdir = Path(results_dir) / study
    files: dict[str, list[Path]] = {c: sorted((sdir / c / "provenance").glob("*.json")) for c in cells}
    for pack in sorted(sdir.glob(f"{pack_folder('*')}/provenance/*.json")):
        for c in str(read(pack).get("cell") or "").split(","):
            if c in files:
                files[c].append(pack)
    out: dict[str, list[dict]] = {}
    for cell, paths in files.items():
        states: dict[tuple, dict] = {}
        for path in paths:
            doc = read(path)
            for sub in doc.get("submissions", []):
                if not sub.get("attempts") or "git" not in sub:
                    continue  # never started, or a record without the launcher's submission
                state = submission_code(sub, path.parent, packages)
                kept = states.setdefault(_state_key(state), {**state, "stages": []})
                if doc.get("stage") not in kept["stages"]:
                    kept["stages"].append(doc.get("stage"))
        out[cell] = list(states.values())
    return out


def distinct_states(by_cell: dict[str, list[dict]]) -> list[dict]:
    """The code states over all cells, each once (more than one: the study's cells ran different code)."""
    seen: dict[tuple, dict] = {}
    for states in by_cell.values():
        for s in states:
            seen.setdefault(_state_key(s), s)
    return list(seen.values())


def code_tags(by_cell: dict[str, list[dict]], checkout: dict[str, str]) -> dict[str, str]:
    """The study's MLflow tags of its code: `git.sha`, `git.dirty`, `git.diff_hash`, `version.<pkg>` as the cells'
    jobs ran them ("mixed" where they differ), `lorarl.code_states` (how many distinct states), `lorarl.code_mixed`,
    and the checkout at the time of tagging as `checkout.<tag>`. Without any cell record, only the checkout's."""
    tags = {f"checkout.{k}": str(v) for k, v in checkout.items()}
    states = distinct_states(by_cell)
    if not states:
        return tags

    def one(values: list[str]) -> str:
        return values[0] if len(set(values)) == 1 else "mixed"

    tags.update({"git.sha": one([str(s["sha"]) for s in states]),
                 "git.dirty": one([str(s["dirty"]).lower() for s in states]),
                 "git.diff_hash": one([s["diff_hash"] or "none" for s in states]),
                 **{f"version.{p}": one([s["packages"].get(p, "unknown") for s in states])
                    for p in states[0]["packages"]},
                 "lorarl.code_states": str(len(states)), "lorarl.code_mixed": str(len(states) > 1).lower()})
    return tags


def safely(fn: Any, *args: Any) -> None:
    """Call a provenance writer; an error is a line on stderr, never the job's failure."""
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001 - provenance must never fail a job
        print(f"[lorarl] provenance: {type(err).__name__}: {err}", file=sys.stderr)
