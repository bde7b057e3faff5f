"""The console of plain `snakemake all` (lorarl.pipeline.progress.console): the study's progress line from `lorarl status
--watch`'s snapshot, the base model's build lines while it builds (each printed when it changes), a study whose
files cannot be read costing one line, the thread quiet once stopped, and the `onsuccess` lines naming the report,
the tables and the figures. The Snakefile's handlers (onstart, onsuccess, onerror) run it; the end-to-end run of
tests/project/test_pipeline.py checks the report's path reaches the console."""

from __future__ import annotations

import io
import threading
import time

from lorarl.build_progress import BuildProgress
from lorarl.pipeline.progress.console import Progress, output_lines, progress_line


def snap(**kw) -> dict:
    base = {"study": "demo", "n": 8, "counts": {"done": 3, "running": 2, "not started": 3}, "steps_left": 230,
            "steps_total": 640, "progress": 1 - 230 / 640, "eta_s": 290.0, "eta_lower_bound": False,
            "ended": False, "bases": []}
    return {**base, **kw}


def test_the_progress_line_counts_cells_steps_and_the_eta():
    line = progress_line(snap())
    assert line.startswith("[lorarl] demo ") and "3/8 cells trained, 2 running; 410/640 steps (64%); ETA 4m50s" in line
    assert "ETA >= 4m50s" in progress_line(snap(eta_lower_bound=True))
    assert "ETA ? (no step measured yet)" in progress_line(snap(eta_s=None))
    ended = progress_line(snap(counts={"done": 7, "diverged": 1}, steps_left=0, progress=1.0, ended=True))
    assert "8/8 cells trained, 1 diverged; 640/640 steps (100%); training ended" in ended
    evals = progress_line(snap(counts={"done": 8}, steps_left=0, progress=1.0, ended=True, eta_s=70.0,
                               jobs_left={"evaluate": 3, "aggregate": 1}))
    assert evals.endswith("8/8 cells trained; 640/640 steps (100%); training ended; ETA 1m10s (4 jobs left)")
    assert "(3 jobs left)" in progress_line(snap(jobs_left={"train": 2, "evaluate": 1}))


class Out(io.StringIO):
    """The console: what the thread wrote, and an event set at each write."""

    def __init__(self):
        super().__init__()
        self.wrote = threading.Event()

    def flush(self):
        super().flush()
        self.wrote.set()

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        end = time.monotonic() + timeout
        while text not in self.getvalue() and time.monotonic() < end:
            self.wrote.wait(0.05)
            self.wrote.clear()
        return self.getvalue()


def test_the_thread_prints_the_build_then_the_study_then_stops(tmp_path):
    res = tmp_path / "results"
    build = BuildProgress(res / "models" / "tiny-arith", "tiny-arith", steps=800)
    build.phase("sft")
    looks: list[str] = []

    def snapshot(path, results):
        looks.append(path)
        if path == "broken.yaml":
            raise ValueError("half-written summary.json")
        return snap()

    out = Out()
    prog = Progress(["demo.yaml", "broken.yaml"], res, every=0.2, recipes=["tiny-arith", "tiny-arith"], out=out,
                    snapshot=snapshot, base_every=0.01).start()
    text = out.wait_for("progress unavailable")
    assert "[lorarl] base model tiny-arith: building, SFT step 0/800" in text
    assert text.count("base model tiny-arith") == 1  # unchanged: printed once
    build.step(400)
    build._write(force=True)
    text = out.wait_for("SFT step 400/800")
    assert "[lorarl] base model tiny-arith: building, SFT step 400/800 (50%)" in text
    assert "3/8 cells trained" in text  # the study's line
    assert "[lorarl] broken: progress unavailable (ValueError: half-written summary.json)" in text
    prog.stop()
    assert not prog._thread.is_alive()
    n, written = len(looks), out.getvalue()
    out.wrote.wait(0.5)  # a stopped thread looks no more and writes nothing
    assert len(looks) == n and out.getvalue() == written


def test_a_short_run_computes_no_snapshot_and_no_models_no_base_line(tmp_path):
    looks = []
    out = Out()
    prog = Progress(["demo.yaml"], tmp_path, every=3600, recipes=[], out=out,
                    snapshot=lambda p, r: looks.append(p) or snap(), base_every=0.01).start()
    prog.stop()
    assert looks == [] and out.getvalue() == ""


def test_onsuccess_names_the_report_the_tables_and_the_figures(tmp_path):
    res = tmp_path / "results"
    (res / "demo" / "tables").mkdir(parents=True)
    (res / "demo" / "figures").mkdir()
    for f in ("tables/summary.md", "tables/stats.md", "report.html"):
        (res / "demo" / f).write_text("x")
    (res / "toy" / "tables").mkdir(parents=True)
    (res / "toy" / "tables" / "summary.md").write_text("x")
    lines = output_lines(["demo", "toy"], res)
    assert lines == [f"[lorarl] demo report : {res}/demo/report.html", f"[lorarl] demo table  : {res}/demo/tables/summary.md",
                     f"[lorarl] demo stats  : {res}/demo/tables/stats.md", f"[lorarl] demo figures: {res}/demo/figures/",
                     f"[lorarl] toy table  : {res}/toy/tables/summary.md"]  # a study without a report: its table
