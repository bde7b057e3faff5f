"""Bad input: over 100 generated malformed studies, each refused by `lorarl cells` with exit status 2,
a message naming the file, the place (YAML line / field path) and what is allowed, nothing written
(lorarl.badstudies); hostile labels never give a cell id or path outside results/."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from lorarl import badstudies
from lorarl.language.study import StudyError, load_study

CASES = badstudies.cases()


def test_the_generator_covers_every_kind_of_bad_input():
    cats = Counter(c.category for c in CASES)
    assert len(CASES) >= 100
    assert set(cats) == {"wrong type", "unknown field", "bad axis value", "conflicting axes", "impossible protocol",
                         "unknown benchmark", "missing file", "YAML syntax", "unsafe name", "boolean as number",
                    "too large"}
    assert min(cats.values()) >= 5


@pytest.mark.parametrize("case", CASES, ids=[f"{c.category}: {c.name}" for c in CASES])
def test_each_bad_study_is_refused_cleanly(case, tmp_path: Path):
    result = badstudies.check(case, tmp_path)
    assert result.problems == [], result.message


def test_hostile_labels_never_escape_results():
    assert badstudies.id_escapes() == []


def test_errors_point_at_the_yaml_line(tmp_path: Path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\ndefaults:\n  model: local:tiny-test\n  train:\n    steps: 3\n    lr: fast\n")
    with pytest.raises(StudyError, match=r"defaults\.train\.lr: .*valid number.*\(line 6\)"):
        load_study(f)
    f.write_text("name: s\ndefaults:\n  model: local:tiny-test\n  train: {steps: 3}\n  train: {steps: 4}\n")
    with pytest.raises(StudyError, match=r"duplicate key 'train' at line 5 \(first at line 4\)"):
        load_study(f)
    f.write_text("name: s\ndefaults:\n  adapter: {rnak: 3}\n")
    with pytest.raises(StudyError, match=r"defaults\.adapter\.rnak: unknown field; allowed here: method, rank"):
        load_study(f)


def test_booleans_never_pass_as_numbers_but_bool_fields_take_them():
    from pydantic import ValidationError

    from lorarl.language.config import AdapterConfig, ProtocolOverride, TrainConfig
    from lorarl.language.toy import ToyCellConfig

    for model, field, value in [(AdapterConfig, "rank", True), (TrainConfig, "lr", False), (ToyCellConfig, "rank", True),
                                (TrainConfig, "epsilon_high", True)]:
        with pytest.raises(ValidationError, match=rf"{field}\n.*is a boolean; expected"):
            model.model_validate({field: value})
    assert TrainConfig(keep_checkpoint=True).keep_checkpoint is True  # a bool field still takes a bool
    assert AdapterConfig(rank=4).rank == 4 and TrainConfig(lr=1).lr == 1.0  # ints still pass as floats
    with pytest.raises(ValidationError, match="is a boolean"):
        ProtocolOverride.model_validate({"n": 4, "ks": [1, True]})


TOO_LARGE = [c for c in CASES if c.category == "too large"]


@pytest.mark.parametrize("case", TOO_LARGE, ids=[c.name for c in TOO_LARGE])
def test_too_large_studies_are_refused_before_anything_expands(case, tmp_path: Path):
    """A million cells, a billion cells, alias bombs: exit 2 within a second of CPU and a few MB (before the
    checks, `lorarl cells` ran 5 minutes into 5.6 GB on the million cells, 10 s and 835 MB on an alias bomb).
    CPU time, not wall time, is bounded at 1 s: CI shares its cores; the wall bound only catches a runaway."""
    import time
    import tracemalloc

    badstudies.check(badstudies.Case("warm-up", "valid", badstudies._dump(badstudies.VALID), ""), tmp_path / "w")
    tracemalloc.start()
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = badstudies.check(case, tmp_path / "case")
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result.problems == [], result.message
    assert cpu < 1.0 and wall < 20 and peak < 50 * 2**20, (cpu, wall, peak)


def test_the_cell_cap_names_each_axis_and_is_configurable(tmp_path: Path, monkeypatch):
    f = tmp_path / "study.yaml"
    f.write_text(badstudies._dump(badstudies.VALID))  # 2 ranks x 2 seeds
    monkeypatch.setenv("LORARL_MAX_CELLS", "lots")
    with pytest.raises(StudyError, match=r"LORARL_MAX_CELLS='lots': allowed: a positive whole number"):
        load_study(f)
    monkeypatch.setenv("LORARL_MAX_CELLS", "3")
    with pytest.raises(StudyError, match=r"multiply to 4 cells: axes\.rank \(2\) x axes\.seed \(2\); allowed: at "
                                         r"most 3 cells .*LORARL_MAX_CELLS=<cells>"):
        load_study(f)
    monkeypatch.setenv("LORARL_MAX_CELLS", "4")
    assert len(load_study(f)._table) == 4
    monkeypatch.delenv("LORARL_MAX_CELLS")
    from lorarl.language.matrix import MAX_CELLS, max_cells

    assert max_cells() == MAX_CELLS == 100_000


def test_alias_bombs_name_the_alias_and_its_line(tmp_path: Path):
    bomb = next(c for c in TOO_LARGE if c.name == "three-line alias bomb")
    f = tmp_path / "study.yaml"
    f.write_text(bomb.text)
    with pytest.raises(StudyError, match=r"aliases expand to more than 100,000 nodes .*the alias \*l1 at line "
                                         r"\d+ alone stands for 10,101 nodes; allowed"):
        load_study(f)
    f.write_text("name: s\nx: &x {a: 1}\ny: *x\nz: {<<: *x, b: 2}\n")  # ordinary aliases and merges still load
    from lorarl.language import yamlpos

    assert yamlpos.load(f.read_text(), str(f)) == {"name": "s", "x": {"a": 1}, "y": {"a": 1}, "z": {"a": 1, "b": 2}}


def test_snakemake_refuses_a_too_large_study_before_writing_anything(tmp_path: Path):
    """`snakemake all` on a million-cell study and on an alias bomb: the same message, exit 2, and
    nothing written but Snakemake's own log (.snakemake/log/)."""
    import subprocess

    from lorarl.pipeline.drills import faults, recovery

    for name, says in (("axes multiply to a million cells", "1,000,000 cells: axes.seed (10) x axes.rank (10)"),
                       ("three-line alias bomb", "aliases expand to more than 100,000 nodes")):
        root = tmp_path / name.split()[0]
        root.mkdir()
        (root / "study.yaml").write_text(next(c for c in TOO_LARGE if c.name == name).text)
        recovery.workspace(root, {"studies": [str(root / "study.yaml")]})
        before = {p for p in root.rglob("*")}
        run = subprocess.run(recovery.argv(faults.RUN, str(root / "study.yaml")), cwd=root, env=faults._env(), capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and says in run.stderr + run.stdout, run.stderr[-2000:]  # as `lorarl cells`
        written = {str(p.relative_to(root)) for p in set(root.rglob("*")) - before}
        assert {w for w in written if not w.startswith(".snakemake")} == set(), written
        assert {w.split("/")[1] for w in written if "/" in w} <= {"log"}, written
