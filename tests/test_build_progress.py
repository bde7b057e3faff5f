"""A local base model's build shows its progress: the build writes results/models/.logs/<recipe>/progress.json
(lorarl.build_progress), `lorarl status` and `--watch` print one line per base model the study still waits for,
and the batched SFT trains exactly as the per-step padding did (same draws, same losses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorarl import build_progress, models
from lorarl.build_progress import BuildProgress, base_lines, describe, progress_file

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_writer_throttles_steps_and_writes_every_phase(tmp_path):
    clock = Clock()
    model_dir = tmp_path / "models" / "tiny-arith"
    p = BuildProgress(model_dir, "tiny-arith", steps=100, clock=clock)
    assert p.path == tmp_path / "models" / ".logs" / "tiny-arith" / "progress.json" == progress_file(model_dir)
    p.phase("data")
    assert json.loads(p.path.read_text())["phase"] == "data"
    clock.t += 5
    p.phase("sft")
    clock.t += build_progress.WRITE_EVERY_S
    p.step(10)
    assert json.loads(p.path.read_text())["step"] == 10  # WRITE_EVERY_S after the last write
    clock.t += build_progress.WRITE_EVERY_S / 2
    p.step(11)
    assert json.loads(p.path.read_text())["step"] == 10  # throttled
    p.step(100)
    doc = json.loads(p.path.read_text())
    assert doc["step"] == 100 and doc["sft_started"] == 1005.0 and doc["updated"] == clock.t  # the last step: always written


def test_each_state_reads_as_a_line():
    now = 2000.0
    assert describe(None, None, now) == "not started"
    doc = {"phase": "data", "step": 0, "steps": 800, "started": now - 7, "sft_started": None, "updated": now - 1}
    assert describe(doc, True, now) == "building: tokenizer and SFT data (7s so far)"
    doc.update(phase="sft", step=200, sft_started=now - 21, updated=now - 1)  # 0.1 s/step, 600 steps left
    assert describe(doc, True, now) == "building, SFT step 200/800 (25%), 0.10 s/step, ETA 59s"
    assert describe(doc, False, now).startswith("interrupted at SFT step 200/800")  # its process is gone
    assert describe({**doc, "updated": now - build_progress.STALE_S - 1}, None, now).startswith("interrupted")
    assert describe({**doc, "phase": "saving"}, True, now) == "building: saving the model"


def test_a_study_lists_its_recipes_parents_first():
    from lorarl.language.study import load_study, study_cells

    assert models.study_recipes(study_cells(load_study(REPO / "experiments" / "demo.yaml"))) == ["tiny-arith"]
    cells = study_cells(load_study(REPO / "experiments" / "reward_density_cpu.yaml"))  # a teacher continues tiny-arith
    names = models.study_recipes(cells)
    assert "tiny-arith-boxed" in names and names.index("tiny-arith") < names.index("tiny-arith-boxed")


def test_base_lines_skip_built_models_and_judge_this_hosts_build_by_its_process(tmp_path):
    res = tmp_path / "results"
    assert base_lines(["tiny-arith"], res) == ["base model tiny-arith: not started"]
    p = BuildProgress(res / "models" / "tiny-arith", "tiny-arith", steps=800)
    p.phase("sft")
    assert base_lines(["tiny-arith"], res)[0].startswith("base model tiny-arith: building, SFT step 0/800")
    doc = json.loads(p.path.read_text())
    p.path.write_text(json.dumps({**doc, "pid": 2 ** 22 + 17}))  # no such process on this host
    assert "interrupted" in base_lines(["tiny-arith"], res)[0]
    (res / "models" / "tiny-arith" / "config.json").parent.mkdir(parents=True)
    (res / "models" / "tiny-arith" / "config.json").write_text("{}")
    assert base_lines(["tiny-arith"], res) == []  # built: no line


def test_a_real_build_reports_its_sft_steps_then_removes_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(build_progress, "WRITE_EVERY_S", 0.0)
    seen: list[dict] = []
    real_sft = models.sft

    def watching_sft(model, tok, examples, recipe, progress=True, on_step=None):
        def step(i):
            on_step(i)
            seen.append(json.loads(progress_file(out).read_text()))
        return real_sft(model, tok, examples, recipe, progress=False, on_step=step)

    monkeypatch.setattr(models, "sft", watching_sft)
    out = tmp_path / "models" / "tiny-test"
    models.build_base("tiny-test", out, threads=1)
    steps = models.RECIPES["tiny-test"].sft_steps
    assert [d["step"] for d in seen] == list(range(1, steps + 1)) and {d["phase"] for d in seen} == {"sft"}
    assert (out / "config.json").exists() and not progress_file(out).exists()


def test_batched_sft_equals_the_per_step_padded_batches():
    """The table tokenized once (right padding, no attention mask) gives the losses of per-step padded batches
    with an attention mask: under the causal mask no real token sees the padding after it."""
    import random

    import torch

    recipe = models.RECIPES["tiny-test"]
    train, tok = models.recipe_data_and_tokenizer(recipe)
    examples = [(p.prompt, p.solution) for p in train[:64]]
    ids_NL, labels_NL, len_N = models.encode_sft(tok, examples)
    torch.manual_seed(0)
    model = models.build_tiny(recipe, len(tok), tok.eos_token_id, tok.pad_token_id)
    idx = random.Random(3).sample(range(len(examples)), 8)
    width = int(len_N[idx].max())
    batched = model(input_ids=ids_NL[idx, :width], labels=labels_NL[idx, :width]).loss
    ids = torch.full((8, width), tok.pad_token_id)
    labels = torch.full((8, width), -100)
    attn = torch.zeros((8, width), dtype=torch.long)
    for i, j in enumerate(idx):
        p, c = tok(examples[j][0])["input_ids"], tok(examples[j][1])["input_ids"] + [tok.eos_token_id]
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p): len(p) + len(c)] = torch.tensor(c)
        attn[i, : len(p) + len(c)] = 1
    padded = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    assert batched.item() == pytest.approx(padded.item(), abs=1e-6)


def test_status_prints_the_base_line_while_nothing_trains(tmp_path):
    res = tmp_path / "results"
    BuildProgress(res / "models" / "tiny-arith", "tiny-arith", steps=800).phase("sft")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", "import sys; from lorarl.cli import main; sys.exit(main())", "status", str(REPO / "experiments" / "demo.yaml"),
                           "--results", str(res)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("base model tiny-arith: building, SFT step 0/800"), proc.stdout


def test_the_demos_watcher_prints_each_change_and_ends_when_built(tmp_path, capsys):
    import threading
    import time

    res = tmp_path / "results"
    p = BuildProgress(res / "models" / "tiny-arith", "tiny-arith", steps=800)
    p.phase("sft")
    done = []
    t = threading.Thread(target=lambda: done.append(build_progress.main(["tiny-arith", "--results", str(res),
                                                                          "--every", "0.05"])))
    t.start()
    time.sleep(0.3)  # the same line again and again: printed once
    (res / "models" / "tiny-arith").mkdir()
    (res / "models" / "tiny-arith" / "config.json").write_text("{}")
    t.join(timeout=10)
    assert done == [0]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("base model tiny-arith: building, SFT step 0/800")


def test_openmp_threads_sleep_only_on_a_busy_machine(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert models.omp_wait_policy(load1=0.7, cores=2) is None and "OMP_WAIT_POLICY" not in os.environ  # quiet: spin
    assert models.omp_wait_policy(load1=2.3, cores=2) == "PASSIVE" == os.environ["OMP_WAIT_POLICY"]  # busy: sleep
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert models.omp_wait_policy(load1=9.0, cores=2) == "ACTIVE"  # the user's choice stands
