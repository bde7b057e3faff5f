"""Jobs import what their stage needs (issue 38; bench/job_start.py measures the seconds).

Two fresh interpreters (tests/support/stage_imports.py) run the stages' real entries and report `sys.modules`:
- the aggregate of a toy KL-bound study and of a GRPO study (synthetic finished cells): no torch, hence no
  transformers, TRL, peft or torch's compile stack;
- the evaluation of a tiny base model, the training of one cell and its diagnosis, each through run_stage
  like a job: at each stage's first real work and at its end, no scikit-learn, scipy.optimize or
  scipy.stats (transformers' optional imports, lorarl.lazy_imports), and the evaluation no TRL; then every
  deferred name called works and returns what the real function returns.
torch._dynamo is not held off: transformers decorates a function with `torch._dynamo.assume_constant_result`
as `modeling_utils` loads (integrations/deepgemm.py), so every model load needs it.

The deferral's mechanism is also tested in-process on a fake package (no transformers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorarl import lazy_imports
from tests.support.study import seeds, tiny_study

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = ("sklearn", "scipy.optimize", "scipy.stats")  # transformers' optional imports, deferred in jobs
TORCH_STACK = ("torch", "torch._dynamo", "transformers", "peft", "trl")


def stage_imports(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "stage_imports.py"), json.dumps(spec)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_aggregate_imports_no_torch(tmp_path: Path):
    import numpy as np

    from lorarl import paths
    from lorarl.language.study import base_cells, load_study, parse_study, study_cells
    from tests.support.report_fixture import _eval, make_study

    grpo, results = make_study(tmp_path, study=tiny_study(
        "agg", task=None, adapter=None, train={"steps": 40}, eval={"eval_every": 10},
        axes={"regime": {"field": "reward.regime", "values": ["outcome", "process"]},
              "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 16]},
              "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}))
    for b in base_cells(load_study(grpo)):  # the untrained model's evaluation
        _eval(results / "agg" / b.id / "eval", "synthetic", np.arange(100) % 3 == 0, None)
    toy = {"name": "toy", "kind": "kl_bound_toy", "axes": {"rank": {"field": "rank", "prefix": "r", "values": [1, 8]},
                                                          "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}}
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(toy))
    for cell in study_cells(parse_study(toy)):  # what the toy job writes per cell
        p = paths.path("summary", results=results, study="toy", cell=cell.id)
        p.parent.mkdir(parents=True, exist_ok=True)
        r = cell.config.rank
        p.write_text(json.dumps({"kl": 1e-9 * r, "kl_max": 2e-9 * r, "bound": 1e-6 * r, "mu": 1e-6, "bound_holds": True}))
    out = stage_imports({"aggregate": [str(tmp_path / "toy.yaml"), str(grpo)], "results": str(results)})
    for phase in (f"aggregate {tmp_path / 'toy.yaml'}", f"aggregate {grpo}"):
        assert not set(out[phase]) & set(TORCH_STACK), (phase, out[phase])
    assert "pandas" in out[f"aggregate {grpo}"]  # the phases ran
    assert (results / "toy" / "tables" / "summary.md").exists() and (results / "agg" / "report.html").exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from tests.support.tiny_model import save_tiny

    return Path(save_tiny(tmp_path_factory.mktemp("tiny")))


def test_jobs_defer_transformers_optional_imports(tmp_path: Path, tiny: Path):
    study = tmp_path / "jobs.yaml"
    study.write_text(yaml.safe_dump(tiny_study(
        "jobs", model=str(tiny), task={"name": "synthetic", "n_train": 16, "n_eval": 2},
        train={"steps": 1, "prompts_per_step": 2, "generations": 2, "max_completion_length": 4, "lr": 1e-3},
        eval={"max_new_tokens": 4}, axes=seeds(0))))
    s = str(study)
    out = stage_imports({"jobs": [["evaluate", s, "base"], ["train", s, "s0"], ["diagnose", s, "s0"]],
                         "results": str(tmp_path / "results"), "call_deferred": True})
    for phase in ("evaluate", "train", "diagnose"):  # at each stage's end (sys.modules only grows)
        assert not set(out[phase]) & set(OPTIONAL), (phase, out[phase])
    assert "trl" not in out["evaluate"]
    # each stage reached its first real work (the line bench/job_start.py reads) with its stack loaded
    assert {"torch", "transformers"} <= set(out["evaluate first evaluation batch"])
    assert "trl" in out["train first training step"] and "peft" in out["diagnose first diagnostic"]
    for name, (deferred, real) in out["deferred_calls"].items():  # the features that need them still work
        assert deferred == real, name
    assert set(out["deferred_calls"]) >= {"transformers.generation.candidate_generator.roc_curve",
                                          "transformers.data.metrics.f1_score",
                                          "transformers.loss.loss_rt_detr.linear_sum_assignment"}
    assert set(out["real_modules"].values()) == {"module"}  # no stand-in left in sys.modules


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch):
    """`fakelib.user` imports `fakelib.heavy.f` as it loads (as transformers imports roc_curve); `fakelib.heavy`
    records that it ran; `fakelib.other` imports `fakelib.heavy.g` while `fakelib.user` loads."""
    pkg = tmp_path / "fakelib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("import sys\nsys.modules['fakelib'].heavy_ran = True\n"
                                  "def f(x):\n    return x + 1\ndef g(x):\n    return 2 * x\n")
    (pkg / "user.py").write_text("from fakelib.heavy import f\n")
    (pkg / "user2.py").write_text("import fakelib.other\nfrom fakelib.heavy import f\n")
    (pkg / "other.py").write_text("from fakelib.heavy import g\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(lazy_imports, "DEFERRED", {n: {"fakelib.heavy": ("f",)} for n in ("fakelib.user", "fakelib.user2")})
    # a job entry run in-process earlier in the session may have installed the deferral: start without it
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, lazy_imports._Finder)])
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "fakelib"]:
        del sys.modules[name]


def test_deferred_name_imports_the_real_module_when_called(fake_package, monkeypatch):
    monkeypatch.delenv(lazy_imports.EAGER_ENV, raising=False)
    lazy_imports.defer_optional_imports()
    lazy_imports.defer_optional_imports()  # once per process
    assert sum(isinstance(f, lazy_imports._Finder) for f in sys.meta_path) == 1
    import fakelib
    import fakelib.user

    assert "fakelib.heavy" not in sys.modules and not hasattr(fakelib, "heavy_ran")  # deferred, no stand-in left
    assert fakelib.user.f(1) == 2  # the first call imports the real module
    assert fakelib.heavy_ran and type(sys.modules["fakelib.heavy"]).__name__ == "module"
    assert fakelib.user.__loader__.get_source("fakelib.user") == "from fakelib.heavy import f\n"


def test_another_importer_gets_the_real_module_while_the_stand_in_stands(fake_package, monkeypatch):
    monkeypatch.delenv(lazy_imports.EAGER_ENV, raising=False)
    lazy_imports.defer_optional_imports()
    import fakelib.user2

    assert fakelib.other.g(3) == 6 and fakelib.user2.f(1) == 2
    assert type(sys.modules["fakelib.heavy"]).__name__ == "module"


def test_eager_switch_turns_the_deferral_off(fake_package, monkeypatch):
    monkeypatch.setenv(lazy_imports.EAGER_ENV, "1")
    lazy_imports.defer_optional_imports()
    import fakelib
    import fakelib.user

    assert fakelib.heavy_ran and not any(isinstance(f, lazy_imports._Finder) for f in sys.meta_path)


def test_first_work_line_is_printed_once_and_read_by_the_bench(capsys, monkeypatch):
    import importlib.util
    import time

    from lorarl import jobclock

    monkeypatch.setattr(jobclock, "_printed", set())
    jobclock.first_work("training step")
    jobclock.first_work("training step")  # once per process and kind of work
    jobclock.first_work("evaluation batch")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    spec = importlib.util.spec_from_file_location("job_start", REPO / "bench" / "job_start.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    work, age, cpu, epoch = bench.LINE.search(lines[0]).groups()
    assert work == "training step" and float(age) > 0 and float(cpu) > 0 and abs(float(epoch) - time.time()) < 60
    code = "import time; time.sleep(0.5); from lorarl.jobclock import process_age_s; print(process_age_s())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.5 <= age < 30  # seconds since that process started
