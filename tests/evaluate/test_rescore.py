"""`lorarl rescore`: stored samples are graded again without generating; on an unchanged grader the
stored summaries are reproduced exactly (byte for byte, files untouched); changed grades rewrite
the summary and the cell's MLflow numbers."""

from __future__ import annotations

import json

import pytest
import yaml

from lorarl.cli import main
from lorarl.evaluate import records
from lorarl.evaluate.backends import Completion
from lorarl.grading.benchmarks import get_benchmark
from lorarl.grading.protocols import Protocol
from tests.support.study import tiny_study

STUDY = tiny_study("rs", task=None, adapter=None, model="test-org/never-loaded", train={"steps": 6},
                   eval={"eval_every": 3, "benchmarks": ["math500", "gpqa"]})

TEXTS = ["\\boxed{1}", "\\boxed{2}", "no answer", "\\boxed{\\frac{6}{2}}", "The answer is (B)",
         "\\boxed{4.0}", "\\boxed{x}", "\\boxed{5}"]


class Scripted:
    def generate(self, prompts, protocol, seed=0):
        k = iter(range(10 ** 6))
        return [[Completion(TEXTS[next(k) % len(TEXTS)], 5, False) for _ in range(protocol.n)] for _ in prompts]


@pytest.fixture()
def stored(tmp_path):
    """A study with cell s0 evaluated on math500 (avg@4) and gpqa, final and at step 3, plus an MLflow run."""
    from lorarl.tracking.client import Tracker

    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    res = tmp_path / "results"
    edir = res / "rs" / "s0" / "eval"
    math = get_benchmark("math500").load(rows=[{"problem": f"{i}+1?", "answer": str(i + 1),
                                                "unique_id": f"t/{i}.json"} for i in range(5)])
    gpqa_b = get_benchmark("gpqa")
    gpqa = gpqa_b.load(rows=[dict(gpqa_b.example, **{"Record ID": f"r{i}", "Question": f"Q{i}?"}) for i in range(4)])
    for step in (None, 3):
        records.run_benchmark(Scripted(), get_benchmark("math500"), math, edir, step=step,
                              protocol=Protocol.sampling(4, max_new_tokens=16), timeout_s=2.0)
        records.run_benchmark(Scripted(), gpqa_b, gpqa, edir, step=step, protocol=Protocol.greedy(16))
    tracker = Tracker(res, "rs")
    run = tracker.start("s0", "s0", tags={}, params={})
    tracker.finish()
    (res / "rs" / "s0" / "summary.json").write_text(json.dumps({"mlflow_run_id": run}))
    return f, res, edir, run


def _snapshot(d):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


def test_rescore_file_reproduces_the_stored_summary_exactly(stored, capsys):
    _, _, edir, _ = stored
    before = _snapshot(edir)
    assert main(["rescore", str(edir / "math500.jsonl"), "--check"]) == 0
    assert "identical" in capsys.readouterr().out
    assert _snapshot(edir) == before                             # same bytes, files not even rewritten


def test_rescore_cell_covers_every_stored_evaluation(stored, capsys):
    f, res, edir, _ = stored
    before = _snapshot(edir)
    assert main(["rescore", str(f), "s0", "--results", str(res), "--check"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical") == 4 and "math500@3.jsonl" in out and "gpqa.jsonl" in out
    assert "4 evaluation(s) re-scored; 0 changed" in out
    assert _snapshot(edir) == before
    assert main(["rescore", str(f), "--results", str(res)]) == 0  # every cell: s1 has no evaluations
    for jsonl in edir.glob("*.jsonl"):                             # the library call agrees
        assert records.rescore(jsonl) == json.loads(jsonl.with_suffix(".json").read_text())


def test_changed_grades_rewrite_summary_and_mlflow(stored, capsys):
    import mlflow

    f, res, edir, run = stored
    jsonl = edir / "math500.jsonl"
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    fixed = [dict(x, completion="\\boxed{" + x["gold"] + "}") if x["sample"] == 0 else x for x in lines]
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in fixed))  # e.g. a grader upgrade
    old = json.loads(jsonl.with_suffix(".json").read_text())
    before = _snapshot(edir)
    assert main(["rescore", str(f), "s0", "--results", str(res), "--dry-run", "--check"]) == 1
    assert _snapshot(edir) == before                                 # dry run writes nothing
    assert "CHANGED" in capsys.readouterr().out
    assert main(["rescore", str(f), "s0", "--results", str(res)]) == 0
    new = json.loads(jsonl.with_suffix(".json").read_text())
    assert new["metrics"]["pass@4"]["value"] == 1.0 and new["metrics"] != old["metrics"]
    assert {k: v for k, v in new.items() if k != "metrics"} == {k: v for k, v in old.items() if k != "metrics"}
    assert all(s.correct for s in records.read_samples(jsonl) if s.sample == 0)
    client = mlflow.MlflowClient(f"sqlite:///{res}/mlflow.db")
    hist = client.get_metric_history(run, "eval/math500/pass_at_4")
    assert [(m.step, m.value) for m in hist] == [(6, 1.0)]         # final numbers at the last train step
    assert main(["rescore", str(f), "s0", "--results", str(res), "--check"]) == 0  # now stable
