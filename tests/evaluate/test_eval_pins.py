"""Evaluation data as the papers had it: every hub benchmark is read at a pinned dataset commit (the registry's, or a
study's own), its problem count at that commit is checked when the full benchmark loads, a mirror (another hub id) is
never read at the registry's pin, every published study's fidelity table names the commits it evaluates at, and
offline a benchmark not cached at its pin is named and refused, never fetched (as a training set). A
benchmark the registry measures before training (paper 001 Table 2's capability envelope) is evaluated on the
untrained rows only (base, teacher), unless a study asks for it on trained cells (`trained: true`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lorarl.language.config import CellConfig
from lorarl.language.evalplan import plan
from lorarl.grading.benchmarks import BENCHMARKS
from lorarl.language.study import base_cells, load_study, study_cells
from tests.support.published import PUBLISHED, fidelity_table

ROOT = Path(__file__).resolve().parents[2]
COMMIT = re.compile(r"[0-9a-f]{40}")


def test_every_hub_benchmark_is_pinned_with_its_problem_count():
    for name, bench in BENCHMARKS.items():
        if bench.hub_id is None:
            continue
        assert bench.revision and COMMIT.fullmatch(bench.revision), f"{name}: {bench.revision!r}"
        assert bench.n_problems and bench.n_problems > 0, name
    same = {n: (b.hub_id, b.config, b.split, b.revision) for n, b in BENCHMARKS.items()}
    assert same["math500_envelope"] == same["math500"]  # one dataset, one pin
    assert same["aime22"] == same["aime23"] == same["aime22_24"]
    assert BENCHMARKS["aime22"].n_problems + BENCHMARKS["aime23"].n_problems + 30 == BENCHMARKS["aime22_24"].n_problems


@pytest.mark.parametrize("path", [p for p in PUBLISHED if p.stem != "kl_bound_toy"], ids=lambda p: p.stem)
def test_every_published_benchmark_is_pinned_and_named_in_the_fidelity_table(path):
    """As the training sets (tests/tasks/test_dataset_pins.py): a commit in the `evaluation data` row, or `NOT pinned`."""
    row = " ".join(fidelity_table(path)["evaluation data"])
    study = load_study(path)
    for cell in study_cells(study) + base_cells(study):
        for name, spec in plan.benchmark_specs(cell.config).items():
            repo = spec.hub_id or BENCHMARKS[name].hub_id
            if spec.path is not None or repo is None:
                continue
            rev = plan.data_revision(name, spec)
            if rev is None:
                assert re.search(rf"{re.escape(repo)} NOT pinned", row), f"{path.name} {cell.id}: {name} unpinned"
            else:
                assert COMMIT.fullmatch(rev) and f"{repo}@{rev}" in row, f"{path.name} {cell.id}: {name} {rev}"


def _cfg(**spec) -> CellConfig:
    return CellConfig.model_validate({"model": "local:tiny-arith", "eval": {"benchmarks": {"math500": spec}}})


def test_a_mirror_is_not_read_at_the_registrys_pin(monkeypatch):
    import datasets

    from lorarl.evaluate.main import load_problems
    from lorarl.language.hubcheck import references

    calls = []

    def fake_load(path, name=None, split=None, revision=None, **kw):
        calls.append((path, revision))
        return datasets.Dataset.from_list([{**BENCHMARKS["math500"].example, "unique_id": f"p{i}"} for i in range(500)])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    pin = BENCHMARKS["math500"].revision
    for spec, want in (({}, pin), ({"revision": "v2"}, "v2"), ({"hub_id": "me/math500-copy"}, None),
                       ({"hub_id": "me/math500-copy", "revision": "abc"}, "abc")):
        cfg = _cfg(**spec)
        assert plan.data_revision("math500", cfg.eval.benchmarks["math500"]) == want
        assert len(load_problems("math500", cfg)) == 500 and calls[-1][1] == want
        (ref,) = [r for r in references(cfg) if r.field == "eval.benchmarks.math500"]
        assert ref.revision == want
    calls.clear()
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(1) or datasets.Dataset.from_list(
        [{**BENCHMARKS["math500"].example, "unique_id": f"p{i}"} for i in range(499)]))
    with pytest.raises(ValueError, match=r"math500: HuggingFaceH4/MATH-500@6e4ed1a\w+ gave 499 problems, the registry "
                                         r"states 500"):
        load_problems("math500", _cfg())
    assert len(load_problems("math500", _cfg(hub_id="me/math500-copy"))) == 499  # not the pinned data: not counted


def test_the_registrys_pin_is_in_the_evaluation_signature(monkeypatch):
    import dataclasses

    cfg = _cfg()
    before = plan.eval_signature(cfg, "math500")
    monkeypatch.setitem(BENCHMARKS, "math500", dataclasses.replace(BENCHMARKS["math500"], revision="0" * 40))
    assert plan.eval_signature(cfg, "math500") != before  # a new pin reads other data: the evaluation reruns
    assert plan.eval_signature(_cfg(revision="v2"), "math500") == plan.eval_signature(_cfg(revision="v2"), "math500")


def _envelope(**envelope) -> CellConfig:
    return CellConfig.model_validate({"model": "local:tiny-arith", "train": {"steps": 10}, "eval": {
        "eval_every": 5, "benchmarks": {"math500": {}, "math500_envelope": envelope}}})


def test_the_envelope_is_measured_before_training_only():
    cfg = _envelope()
    assert plan.eval_targets(cfg, is_base=True) == [("math500", None), ("math500_envelope", None)]
    assert plan.eval_targets(cfg) == [("math500", None), ("math500", 5)]  # no final, no snapshot of the envelope
    assert plan.curve_benchmarks(cfg) == ["math500"]
    asked = _envelope(trained=True)  # a study that wants it on trained cells too
    assert plan.eval_targets(asked) == [("math500", None), ("math500_envelope", None), ("math500", 5),
                                        ("math500_envelope", 5)]
    assert plan.eval_signature(cfg, "math500") == plan.eval_signature(asked, "math500")
    assert plan.eval_targets(_envelope(trained=False), is_base=True)[-1] == ("math500_envelope", None)


def test_paper_001_evaluates_the_envelope_on_its_base_and_teacher_rows_only():
    """216,000 completions (54 cells x 500 problems x 8 samples at 4,096 tokens) no longer spent after training."""
    from lorarl.language.study import cell_table

    study = load_study(ROOT / "experiments" / "reward_density.yaml")
    table = cell_table(study)
    assert len(table.cells) == 54
    for cell in table.cells:
        assert "math500_envelope" not in {b for b, _ in plan.eval_targets(cell.config)}, cell.id
    rows = {b.id: [t for t, _ in plan.eval_targets(b.config, is_base=True)] for b in table.bases}
    assert rows == {"base": ["math500", "math500_envelope"], "teacher-Qwen3-8B": ["math500_envelope"]}


def test_a_curve_of_a_benchmark_measured_before_training_is_refused():
    with pytest.raises(ValueError, match=r"eval.curve_benchmarks: 'math500_envelope' is measured before training only "
                                         r"\(set eval.benchmarks.math500_envelope.trained: true .*\); allowed: math500"):
        CellConfig.model_validate({"eval": {"eval_every": 5, "benchmarks": ["math500", "math500_envelope"],
                                            "curve_benchmarks": ["math500_envelope"]}})
    ok = CellConfig.model_validate({"train": {"steps": 10}, "eval": {
        "eval_every": 5, "benchmarks": {"math500": {}, "math500_envelope": {"trained": True}},
        "curve_benchmarks": ["math500_envelope"]}})
    assert plan.eval_targets(ok)[-1] == ("math500_envelope", 5)


def test_paper_001s_dag_evaluates_the_envelope_on_three_rows_not_54_cells(tmp_path):
    """Snakemake's own dry run of the published reward_density.yaml: 57 final evaluations (54 cells x math500, the base
    on math500 and the envelope, the teacher on the envelope), not the 111 of the envelope on every trained cell."""
    import yaml

    from tests.support.snakemake import jobs_run, run_snakemake

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "studies": [str(ROOT / "experiments" / "reward_density.yaml")], "results": "results", "launcher": "local",
        "slurm": {}, "hub_check": False}))  # no hub here: the study's models and data are not looked up
    stats = jobs_run(run_snakemake(tmp_path, "all", "-n", timeout=300))
    assert (stats["train"], stats["evaluate"]) == (54, 57), stats


@pytest.mark.parametrize("where", ["defaults", "axis"])
def test_a_bad_trained_value_is_refused_naming_the_field_and_the_allowed(tmp_path, capsys, where):
    """`eval.benchmarks.<b>.trained` (the envelope on trained cells too) takes true or false: anything else exits 2 with
    the field, the value and the allowed ones, in the study's defaults or an axis value alike."""
    import yaml

    from lorarl.cli import main
    from tests.support.study import seeds, tiny_study

    envelope = {"math500": {}, "math500_envelope": {} if where == "axis" else {"trained": "maybe"}}
    axes = {**seeds(0), "env": {"field": "eval.benchmarks.math500_envelope.trained", "values": ["maybe"]}} \
        if where == "axis" else seeds(0)
    study = tiny_study("bad_trained", eval={"benchmarks": envelope}, axes=axes)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    assert main(["cells", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert "eval.benchmarks.math500_envelope.trained: Input should be a valid boolean" in err, err
    assert "(got 'maybe'; allowed: true, false)" in err, err


def test_an_uncached_pinned_benchmark_is_named_offline_and_never_fetched(tmp_path, monkeypatch):
    """As a training set (tests/language/test_hubcheck.py): offline, a benchmark whose pinned commit is not in the
    local datasets cache refuses the study before anything runs, naming its field, dataset and commit; a copy
    cached at another commit does not stand in for it; the data is never fetched to find out."""
    import datasets
    import yaml

    from lorarl.language import hubcheck
    from lorarl.language.study import StudyError, load_study_to_run

    home = tmp_path / "hf"
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", hubcheck.ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the benchmark was fetched"))
    study = tmp_path / "pins.yaml"
    study.write_text(yaml.safe_dump({"name": "pins", "defaults": {"model": "local:tiny-arith", "eval": {
        "benchmarks": {"math500_evalchemy": {}, "gsm8k": {}}}}, "axes": {"seed": {"field": "seed", "values": [0]}}}))
    pin = BENCHMARKS["math500_evalchemy"].revision

    def prepared(folder: str, config: str, commit: str) -> None:  # datasets' prepared-arrow layout at one commit
        where = home / "datasets" / folder / config / "0.0.0" / commit
        where.mkdir(parents=True)
        (where / "dataset_info.json").write_text("{}")

    prepared("HuggingFaceH4___math-500", "default", "0" * 40)  # another commit of the same dataset
    with pytest.raises(StudyError) as err:
        load_study_to_run(study)
    text = str(err.value)
    assert (f"defaults.eval.benchmarks.math500_evalchemy: dataset 'HuggingFaceH4/MATH-500' (revision {pin}): not in "
            "the local cache" in text), text
    assert f"dataset 'openai/gsm8k' (config main, revision {BENCHMARKS['gsm8k'].revision}): not in" in text
    prepared("HuggingFaceH4___math-500", "default", pin)
    prepared("openai___gsm8k", "main", BENCHMARKS["gsm8k"].revision)
    assert load_study_to_run(study).name == "pins"
