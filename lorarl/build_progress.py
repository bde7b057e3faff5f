"""A local base model's build progress: `lorarl.models.build_base` writes it, `lorarl status` shows it.

The build of a `local:<recipe>` model (tokenizer, data, SFT) is the first job of a study and the only one
running meanwhile: without this, `lorarl status` said "not started" for every cell and nothing else. The build
rewrites one small JSON file (`results/models/.logs/<recipe>/progress.json`, next to its job's logs) at most
every `WRITE_EVERY_S` seconds; `base_lines` turns it into one line per model the study still waits for:

    base model tiny-arith: building, SFT step 412/800 (52%), 0.11 s/step, ETA 43s
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from lorarl import paths

WRITE_EVERY_S = 2.0  # the build rewrites its progress file at most this often (and at each phase change)
STALE_S = 300.0  # a build on another host (Slurm) with no update for this long is shown as "no update"


def progress_file(model_dir: str | Path) -> Path:
    """Where the build of the model at `model_dir` (`<results>/models/<recipe>`) reports its progress."""
    d = Path(model_dir)
    return d.parent / ".logs" / d.name / "progress.json"


class BuildProgress:
    """The writer: `phase()` at each phase change, `step()` after every SFT step (throttled)."""

    def __init__(self, model_dir: str | Path, recipe: str, steps: int, clock: Any = time.time) -> None:
        self.path = progress_file(model_dir)
        self.clock = clock
        now = clock()
        self.doc: dict[str, Any] = {"recipe": recipe, "host": socket.gethostname(), "pid": os.getpid(),
                                    "phase": "data", "step": 0, "steps": steps, "started": now,
                                    "sft_started": None, "updated": now}
        self._written = float("-inf")

    def phase(self, name: str) -> None:
        self.doc["phase"] = name
        if name == "sft":
            self.doc["sft_started"] = self.clock()
        self._write(force=True)

    def step(self, i: int) -> None:
        self.doc["step"] = i
        self._write(force=i == self.doc["steps"])

    def _write(self, force: bool) -> None:
        now = self.clock()
        if not force and now - self._written < WRITE_EVERY_S:
            return
        self.doc["updated"] = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.doc))
            os.replace(tmp, self.path)
        except OSError:  # progress is a courtesy: it never fails a build
            return
        self._written = now


def read(path: str | Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _fmt_s(s: float) -> str:
    s = int(round(max(s, 0)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def describe(doc: dict[str, Any] | None, alive: bool | None, now: float) -> str:
    """The state of one unbuilt model from its progress file. `alive`: whether the build's process is
    running (None: it runs on another host, judged by the file's age)."""
    if doc is None:
        return "not started"
    if alive is None:
        alive = now - float(doc.get("updated", 0)) < STALE_S
    if not alive:
        return (f"interrupted at SFT step {doc.get('step', 0)}/{doc.get('steps', '?')} "
                f"(a rerun builds it again)")
    phase = doc.get("phase")
    if phase == "data":
        return f"building: tokenizer and SFT data ({_fmt_s(now - float(doc['started']))} so far)"
    if phase == "saving":
        return "building: saving the model"
    step, steps = int(doc.get("step", 0)), int(doc.get("steps", 0))
    if not step or not doc.get("sft_started"):
        return f"building, SFT step 0/{steps}"
    per = (float(doc["updated"]) - float(doc["sft_started"])) / step
    eta = (steps - step) * per - (now - float(doc["updated"]))
    return (f"building, SFT step {step}/{steps} ({100 * step / max(steps, 1):.0f}%), {per:.2f} s/step, "
            f"ETA {_fmt_s(eta)}")


def base_lines(recipes: list[str], results: str | Path, now: float | None = None) -> list[str]:
    """One line per local base model (`recipes`: lorarl.models.study_recipes) not built yet under `results`."""
    from lorarl.io import pid_alive

    now = time.time() if now is None else now
    out = []
    for name in recipes:
        model_dir = paths.path("base_model", results=results, name=name).parent
        if (model_dir / "config.json").exists():
            continue
        doc = read(progress_file(model_dir))
        alive = None
        if doc is not None and doc.get("host") == socket.gethostname():
            alive = pid_alive(str(doc.get("pid", "")))
        out.append(f"base model {name}: {describe(doc, alive, now)}")
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m lorarl.build_progress tiny-arith [--results results] [--every 10]`: print each model's line
    whenever it changes, until every one is built (scripts/demo.sh runs it beside the base model's job)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lorarl.build_progress", description=main.__doc__)
    ap.add_argument("recipes", nargs="+", help="local recipes (lorarl.models.RECIPES), parents first")
    ap.add_argument("--results", default="results", help="the results folder (its models/ holds the builds)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between looks")
    args = ap.parse_args(argv)
    last: list[str] = []
    while True:
        lines = base_lines(args.recipes, args.results)
        if not lines:
            return 0
        if lines != last:
            print("\n".join(lines), flush=True)
            last = lines
        time.sleep(args.every)


if __name__ == "__main__":
    raise SystemExit(main())
