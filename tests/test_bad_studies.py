"""Bad input: over 100 generated malformed studies, each refused by `lorarl cells` with exit status 2,
a message naming the file, the place (YAML line / field path) and what is allowed, nothing written
(lorarl.pipeline.badstudies); hostile labels never give a cell id or path outside results/."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from lorarl.pipeline import badstudies
from lorarl.study import StudyError, load_study

CASES = badstudies.cases()


def test_the_generator_covers_every_kind_of_bad_input():
    cats = Counter(c.category for c in CASES)
    assert len(CASES) >= 100
    assert set(cats) == {"wrong type", "unknown field", "bad axis value", "conflicting axes", "impossible protocol",
                         "unknown benchmark", "missing file", "YAML syntax", "unsafe name", "boolean as number"}
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

    from lorarl.config import AdapterConfig, ProtocolOverride, TrainConfig
    from lorarl.toy.config import ToyCellConfig

    for model, field, value in [(AdapterConfig, "rank", True), (TrainConfig, "lr", False), (ToyCellConfig, "rank", True),
                                (TrainConfig, "epsilon_high", True)]:
        with pytest.raises(ValidationError, match=rf"{field}\n.*is a boolean; expected"):
            model.model_validate({field: value})
    assert TrainConfig(keep_checkpoint=True).keep_checkpoint is True  # a bool field still takes a bool
    assert AdapterConfig(rank=4).rank == 4 and TrainConfig(lr=1).lr == 1.0  # ints still pass as floats
    with pytest.raises(ValidationError, match="is a boolean"):
        ProtocolOverride.model_validate({"n": 4, "ks": [1, True]})
