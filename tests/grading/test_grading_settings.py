"""Per-benchmark grading settings (issue 17): study overrides resolve onto the registry's
(math-verify's defaults), are recorded in every summary, reused by rescore, and change an
evaluation's rerun signature only when they differ from the defaults; rescore lists and records the
samples whose verdict changed."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from lorarl.cli import main
from lorarl.language.config import BenchmarkEval, CellConfig, EvalConfig
from lorarl.evaluate import records
from lorarl.evaluate.backends import Completion
from lorarl.grading.benchmarks import get_benchmark
from lorarl.language.evalplan.plan import eval_signature, grading_for
from lorarl.grading.protocols import Protocol
from lorarl.evaluate.main import rescore_file
from lorarl.grading.verify import GradingSettings

ANSWERS = ["\\boxed{3.1416}", "\\boxed{1} and \\boxed{2}", "\\boxed{1\\,000}", "no box"]
GOLDS = ["3.14159", "1,2", "1000", "5"]


class Scripted:
    def generate(self, prompts, protocol, seed=0):
        return [[Completion(ANSWERS[i], 5, False)] for i in range(len(prompts))]


def _problems():
    rows = [{"problem": f"q{i}", "answer": g, "unique_id": f"t/{i}"} for i, g in enumerate(GOLDS)]
    return get_benchmark("math500").load(rows=rows)


def test_override_resolves_onto_registry_defaults():
    assert grading_for("math500") == GradingSettings()
    spec = BenchmarkEval(grading={"float_rounding": 3, "strict": False})
    assert grading_for("math500", spec) == GradingSettings(float_rounding=3, strict=False)
    assert grading_for("math500", BenchmarkEval()) is get_benchmark("math500").grading


@pytest.mark.parametrize("grading, field", [({"float_rounding": -1}, "float_rounding"),
                                            ({"strict": "maybe"}, "strict"),
                                            ({"rounding": 3}, "rounding")])
def test_bad_grading_settings_name_the_field(grading, field):
    with pytest.raises(ValidationError, match=field):
        EvalConfig(benchmarks={"math500": {"grading": grading}})


def test_signature_changes_only_for_non_default_settings():
    def sig(grading):
        cfg = CellConfig(eval={"benchmarks": {"math500": {"grading": grading}}})
        return eval_signature(cfg, "math500")

    assert sig({}) == sig({"strict": True, "float_rounding": 6})   # the defaults spelled out
    assert sig({"float_rounding": 3}) != sig({})
    assert sig({"allow_set_relation_comp": True}) != sig({"strict": False}) != sig({})


def test_settings_are_recorded_and_reused_by_rescore(tmp_path, capsys):
    bench = get_benchmark("math500")
    loose = GradingSettings(float_rounding=3)
    s = records.run_benchmark(Scripted(), bench, _problems(), tmp_path, protocol=Protocol.greedy(16),
                              grading=loose)
    assert s["grading"] == loose.to_dict()
    assert s["metrics"]["pass@1"]["value"] == 0.75      # 3.1416 ~ 3.14159 at 3 places; set; 1 000
    jsonl = tmp_path / "math500.jsonl"
    assert [x.correct for x in records.read_samples(jsonl)] == [True, True, True, False]
    assert records.rescore(jsonl) == s                   # the stored settings are reused

    strict = rescore_file(jsonl, write=True, grading=GradingSettings())   # the defaults: 6 places
    assert strict["metrics_changed"] == ["pass@1"] and strict["new"]["grading"]["float_rounding"] == 6
    assert [(f["problem_id"], f["correct_before"], f["correct_after"]) for f in strict["verdicts_changed"]] \
        == [("t/0", True, False)]
    log = [json.loads(x) for x in (tmp_path / "rescore" / "math500.jsonl").read_text().splitlines()]
    assert log == strict["verdicts_changed"] and log[0]["extracted_after"] == "3.1416"

    assert main(["rescore", str(jsonl), "--check"]) == 0       # now stable under the stored defaults
    assert "0 sample verdict(s) changed" in capsys.readouterr().out


def test_rescore_prints_changed_verdicts(tmp_path, capsys):
    records.run_benchmark(Scripted(), get_benchmark("math500"), _problems(), tmp_path,
                          protocol=Protocol.greedy(16))
    jsonl = tmp_path / "math500.jsonl"
    rows = [json.loads(x) for x in jsonl.read_text().splitlines()]
    rows[1]["correct"] = False          # as an older grader (last box only) had stored it
    rows[1]["extracted"] = "2"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["rescore", str(jsonl), "--dry-run", "--check"]) == 1
    out = capsys.readouterr().out
    assert "1 verdict(s) changed" in out
    assert "t/1#0: wrong -> right  gold '1,2'  graded '2' -> '1,2'" in out
    assert not (tmp_path / "rescore").exists()                      # dry run records nothing
