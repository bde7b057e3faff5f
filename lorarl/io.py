"""Atomic file writes: a reader (a rerun, Snakemake, the report, a resumed job) never sees half a file.

`atomic_write_text` writes a temporary file next to the target, fsyncs it and `os.replace`s it in;
on any error the temporary file is removed and the target is left as it was. A writer killed with
SIGKILL cannot remove its temporary file: each one is named after its host and process
(`.<name>.<host>.<pid>.<random>.tmp`), and the next write of the same target removes those of this
host whose process is gone (another host's are left: their process cannot be checked from here).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from lorarl import faulthooks


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path``, fsync it, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().replace(".", "_")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{host}.{os.getpid()}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600 files; results are shared like any other file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sweep_dead_temporaries(path, host)


def _sweep_dead_temporaries(path: Path, host: str) -> None:
    """Remove the temporary files of ``path`` that a killed writer on this host left behind."""
    prefix = f".{path.name}.{host}."
    for p in path.parent.glob(f".{path.name}.*.tmp"):
        pid = p.name[len(prefix):].split(".", 1)[0] if p.name.startswith(prefix) else ""
        if pid.isdigit() and not pid_alive(pid):
            p.unlink(missing_ok=True)


def write_json(path: str | Path, obj: Any, indent: int = 2) -> None:
    """``obj`` as sorted, indented JSON (non-JSON values as ``str``), written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> Any | None:
    """The parsed file, or None when it is missing or not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def pid_alive(pid: str | int) -> bool:
    """This host's process `pid` runs. A zombie (exited, not yet reaped: where init reaps late, for a
    while after a SIGKILL) is not alive, though `kill -0` succeeds on it."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def disk_full_hook(path: Path) -> None:
    """Test hook LORARL_FAULT=disk_full: the write of `path` fails as on a full disk (ENOSPC); the
    launcher's handling is in lorarl.pipeline.jobs.diskfull."""
    if faulthooks.is_set("disk_full"):
        import errno

        raise OSError(errno.ENOSPC, f"No space left on device ({faulthooks.FAULT_ENV}=disk_full)", str(path))


def tail_text(path: Path, n: int = 40) -> str:
    """The last ``n`` lines of a log (a job's stderr in a failure report), or a note that it is missing."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return f"(no log at {path})"
