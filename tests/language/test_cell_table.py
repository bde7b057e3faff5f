"""The cell table (issue 10): built once per study per process, every default resolved before signing,
one training signature, runtime fields unsigned, the study language's errors and merges."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import BaseModel, Field

import lorarl.language.study as study_mod
from lorarl.train import checkpoint
from lorarl.language import signature
from lorarl.adapters.catalog import get_method
from lorarl.language.study import StudyError, base_cells, cell_table, find_cell, load_study, parse_study, study_cells
from tests.support.study import tiny_study

REPO = Path(__file__).resolve().parents[2]


def raw_study(**over) -> dict:
    raw = tiny_study("t", task=None, adapter=None, eval=None, train={"steps": 3},
                     axes={
                      "rank": {"field": "adapter.rank", "prefix": "r", "values": [2, 4]},
                      "seed": {"field": "seed", "prefix": "s", "values": [0, 1]},
                  })
    raw.update(over)
    return raw


def write(tmp_path: Path, raw: dict, name: str = "s.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


# ---- built once ------------------------------------------------------------------------------------


def test_table_is_built_once_and_lookups_are_dict_accesses(tmp_path, monkeypatch):
    builds = []
    real = study_mod.build_table

    def counting(study, source):
        builds.append(source)
        return real(study, source)

    monkeypatch.setattr(study_mod, "build_table", counting)
    f = write(tmp_path, raw_study())
    s = load_study(f)
    assert load_study(f) is s  # same file, same process: the same study and table
    t = cell_table(s)
    for _ in range(50):
        assert find_cell(s, "r4-s1") is t.cell("r4-s1")
        assert base_cells(s) is t.bases and study_cells(s) is t.cells
    assert t.cell("base") is t.bases[0] and t.is_base("base") and not t.is_base("r2-s0")
    assert t.ids == ["r2-s0", "r2-s1", "r4-s0", "r4-s1"] and t.base_ids == ["base"]
    assert builds == [str(f)]
    f.write_text(yaml.safe_dump(raw_study(name="u"), sort_keys=False))  # edited (same size, same instant)
    assert load_study(f).name == "u" and len(builds) == 2


def test_unknown_cell_names_the_cells():
    t = cell_table(parse_study(raw_study()))
    with pytest.raises(StudyError, match=r"no cell 'r9-s0' in study t; cells: r2-s0, r2-s1, r4-s0, r4-s1, base"):
        t.cell("r9-s0")


def test_eval_signature_is_memoised_and_matches_the_plan():
    from lorarl.language.evalplan import plan

    t = cell_table(parse_study(raw_study()))
    c = t.cell("r2-s0")
    assert t.eval_signature("r2-s0", "synthetic") == plan.eval_signature(c.config, "synthetic")
    assert t.eval_signature("base", "synthetic") == plan.eval_signature(t.bases[0].config, "synthetic", is_base=True)
    assert ("r2-s0", "synthetic", None) in t._eval_sigs


# ---- resolve once, sign once ------------------------------------------------------------------------


def test_method_defaults_are_resolved_before_hashing():
    cells = {c.id: c for c in study_cells(load_study(REPO / "experiments" / "peft_zoo_cpu.yaml"))}
    lora = next(c for c in cells.values() if c.config.adapter.method == "lora_plus")  # no init set: the default
    a = lora.config.adapter
    assert a.init == "kaiming" and a.target_modules == "all-linear" and a.alpha == 2.0 * a.rank
    assert lora.flat_config()["adapter.init"] == "kaiming"  # what MLflow params and cell.json show
    ia3 = next((c for c in cells.values() if c.config.adapter.method == "ia3"), None)
    if ia3 is not None:  # fields that do not apply stay null
        assert ia3.config.adapter.init is None and ia3.config.adapter.target_modules == "canonical"


def test_changing_a_registry_default_changes_exactly_the_affected_hashes(monkeypatch):
    raw = raw_study(axes={"m": {"field": "adapter.method", "prefix": "", "values": ["lora", "lora_plus", "ia3", "full"]},
                          "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}})
    before = {c.id: c.hash for c in study_cells(parse_study(raw))}
    cls = type(get_method("lora_plus"))
    monkeypatch.setattr(cls, "defaults", {**cls.defaults, "lr_ratio": 8.0})
    after = {c.id: c.hash for c in study_cells(parse_study(raw))}
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == ["lora_plus-s0", "lora_plus-s1"]


def test_runtime_fields_are_left_out_of_the_training_signature():
    class Inner(BaseModel):
        lr: float = 1.0  # a setting
        batch: int = Field(4, json_schema_extra={"runtime": True})  # memory only

    class Outer(BaseModel):
        inner: Inner = Inner()  # nested
        by_name: dict[str, Inner] = {"a": Inner()}  # models inside a dict
        workers: int = Field(1, json_schema_extra={"runtime": True})  # memory only

    d = signature.signature_dump(Outer())
    assert d == {"inner": {"lr": 1.0}, "by_name": {"a": {"lr": 1.0}}}
    assert signature.train_signature(Outer(workers=8, inner=Inner(batch=64))) == signature.train_signature(Outer())
    assert signature.train_signature(Outer(inner=Inner(lr=2.0))) != signature.train_signature(Outer())
    # on real cells: a runtime field never changes the cell hash, yet cells differing in it do not merge
    raw = raw_study(axes={"ck": {"field": "train.checkpoint_every", "prefix": "ck", "values": [2, 5]},
                          "bs": {"field": "eval.batch_size", "prefix": "bs", "values": [8, 64]}})
    cells = study_cells(parse_study(raw))
    assert len(cells) == 4 and len({c.hash for c in cells}) == 1 and len({c.eval_hash for c in cells}) == 1


def test_eval_settings_have_their_own_signature():
    a = cell_table(parse_study(raw_study())).cell("r2-s0")
    raw = raw_study()
    raw["defaults"]["eval"] = {"benchmarks": {"synthetic": {}, "gsm8k": {"path": "x.jsonl"}}}
    b = cell_table(parse_study(raw)).cell("r2-s0")
    assert a.hash == b.hash and a.eval_hash != b.eval_hash
    raw["defaults"]["eval"]["eval_every"] = 1  # snapshots are written by training: retrains
    assert cell_table(parse_study(raw)).cell("r2-s0").hash != a.hash


class _Tracker:  # what CellCheckpoints.resume_run asks of lorarl.tracking.client.Tracker
    high_water = 0
    client = SimpleNamespace(get_run=lambda rid: SimpleNamespace(info=SimpleNamespace(lifecycle_stage="active")))

    def resume(self, run_id):
        return run_id


def test_adding_a_benchmark_mid_training_keeps_the_checkpoint(tmp_path):
    raw = raw_study()
    raw["defaults"]["train"]["checkpoint_every"] = 1
    old = cell_table(parse_study(raw)).cell("r2-s0")
    ck = checkpoint.CellCheckpoints(tmp_path, "t", old)
    d = ck.root / "checkpoint-2"
    d.mkdir()
    (d / checkpoint.MARKER).write_text(json.dumps({"step": 2, "config_hash": old.hash, "mlflow_run_id": "run1"}))
    ck.release()
    raw["defaults"]["eval"] = {"benchmarks": ["synthetic", "gsm8k"], "batch_size": 4}  # + a benchmark
    raw["defaults"]["train"]["checkpoint_every"] = 3  # runtime: never invalidates a checkpoint
    new = cell_table(parse_study(raw)).cell("r2-s0")
    ck = checkpoint.CellCheckpoints(tmp_path, "t", new)
    assert ck.resume_run(_Tracker()) == "run1" and ck.resumed.step == 2
    ck.release()
    raw["defaults"]["train"]["lr"] = 0.01  # a training setting: the checkpoint is another config's
    ck = checkpoint.CellCheckpoints(tmp_path, "t", cell_table(parse_study(raw)).cell("r2-s0"))
    assert ck.resume_run(_Tracker()) is None and not d.exists()
    ck.release()


# ---- study language ---------------------------------------------------------------------------------


def test_two_axes_writing_one_field_is_an_error_naming_both():
    raw = raw_study()
    raw["axes"]["seed2"] = {"field": "seed", "prefix": "t", "values": [5, 6]}
    with pytest.raises(StudyError, match=r"axes 'seed' and 'seed2' both set `seed`"):
        parse_study(raw)
    raw = raw_study()
    raw["axes"]["lr"] = {"field": "train.lr", "values": [1e-3]}
    raw["axes"]["rank"]["values"].append({"label": "full", "set": {"adapter.method": "full", "train.lr": 1e-5}})
    with pytest.raises(StudyError, match=r"axes 'rank' and 'lr' both set `train.lr`"):
        parse_study(raw)


def test_inapplicable_axis_field_is_dropped_and_identical_cells_merge(tmp_path):
    raw = raw_study(axes={
        "rank": {"field": "adapter.rank", "prefix": "r", "values": [2, {"label": "full", "set": {"adapter.method": "full"}}]},
        "init": {"field": "adapter.init", "prefix": "i", "values": ["kaiming", "pissa"]},
        "kl": {"field": "train.beta", "prefix": "kl", "values": [0.0]},
        "seed": {"field": "seed", "prefix": "s", "values": [0]},
    })
    t = cell_table(parse_study(raw))
    assert t.ids == ["r2-ikaiming-kl0-s0", "r2-ipissa-kl0-s0", "rfull-kl0-s0"]
    full = t.cell("rfull-kl0-s0")
    assert full.config.adapter.init is None and full.axes["init"] == "n/a" and full.axes["rank"] == "full"
    assert t.cell("rfull-ipissa-kl0-s0") is full and t.cell("rfull-ikaiming-kl0-s0") is full  # old ids still resolve
    assert t.notes == ["init does not apply to full: 2 cells merged into rfull-kl0-s0"]
    f = write(tmp_path, raw)
    out = subprocess.run([sys.executable, "-m", "lorarl.cli", "cells", str(f)], capture_output=True, text=True,
                         check=True).stdout
    assert "init does not apply to full: 2 cells merged into rfull-kl0-s0" in out
    assert out.strip().splitlines()[-1].startswith("3 cells in study 't'")


def test_rank_on_full_is_dropped_for_the_full_cells():
    raw = raw_study(axes={"m": {"field": "adapter.method", "prefix": "", "values": ["lora", "full"]},
                          "rank": {"field": "adapter.rank", "prefix": "r", "values": [2, 4]}})
    t = cell_table(parse_study(raw))
    assert t.ids == ["lora-r2", "lora-r4", "full"]
    assert t.notes == ["rank does not apply to full: 2 cells merged into full"]


def test_a_field_the_defaults_set_stays_an_error():
    raw = raw_study(axes={"m": {"field": "adapter.method", "values": ["lora", "ia3"]}})
    raw["defaults"]["adapter"] = {"init": "pissa"}
    with pytest.raises(StudyError, match=r"adapter.init='pissa' does not apply to method 'ia3'"):
        study_cells(parse_study(raw))


@pytest.mark.parametrize("axis, values, needle", [
    ("rank", [2, -1], "axes.rank.values[1] = -1: adapter.rank: Input should be greater than 0"),
    ("rank", [2, {"label": "bad", "set": {"train.lr": -1.0}}], "axes.rank.values[1] = bad: train.lr: Input should be"),
    ("seed", [0, "x"], 'axes.seed.values[1] = "x": seed: Input should be a valid integer'),
])
def test_invalid_axis_value_is_reported_at_the_axis(axis, values, needle):
    raw = raw_study()
    raw["axes"][axis]["values"] = values
    with pytest.raises(StudyError) as err:
        study_cells(parse_study(raw))
    assert needle in str(err.value) and "defaults." not in str(err.value)


def test_unknown_axis_field_names_the_axis():
    raw = raw_study()
    raw["axes"]["rank"]["field"] = "adapter.rnak"
    with pytest.raises(StudyError, match=r"axes.rank.field sets unknown field `adapter.rnak`; allowed here: .*rank"):
        study_cells(parse_study(raw))


def test_common_smk_does_not_hide_snakemakes_expand():
    assert not hasattr(study_mod, "expand")
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert "expand" not in text.split("validate(config")[0]  # no import of any `expand`
