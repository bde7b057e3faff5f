"""lorarl.adapters' registry and config validation (fields that do not apply, defaults, allowed values,
a light lorarl.language.config) and the PEFT studies built on it (peft_zoo, init_geometry and their CPU twins)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lorarl.adapters import INITS, MASKS, METHODS, AdapterSpecError
from lorarl.adapters.catalog import check_config, get_method
from lorarl.adapters.registry import REGISTRY, Method, register
from lorarl.language.config import AdapterConfig
from lorarl.language.study import StudyError, load_study, parse_study, study_cells

REPO = Path(__file__).resolve().parents[2]
LORA_FAMILY = ("lora", "dora", "rslora", "lora_plus", "lora_fa")


# ---------------------------------------------------------------------------------------------
# registry and config validation
# ---------------------------------------------------------------------------------------------


def test_registry_has_exactly_the_named_methods():
    get_method("lora")
    assert set(REGISTRY) == set(METHODS)
    for m in LORA_FAMILY:
        assert REGISTRY[m].inits == INITS and "init" in REGISTRY[m].fields
    assert REGISTRY["full"].masks == MASKS


@pytest.mark.parametrize("spec,msg", [
    ({"name": "lora"}, "registered twice"),
    ({"name": "nope"}, "not in"),
    ({"name": "ia3", "fields": ("rnak",)}, "unknown fields"),
    ({"name": "ia3", "masks": ("everything",)}, "masks"),
])
def test_register_validates_the_spec(spec, msg, monkeypatch):
    get_method("lora")
    monkeypatch.delitem(REGISTRY, "ia3")  # a free registered name; restored after the test
    cls = type("Bad", (Method,), {"summary": "x", "peft_type": None, **spec})
    with pytest.raises(AdapterSpecError, match=msg):
        register(cls)


def test_register_rejects_defaults_and_inits_that_do_not_fit(monkeypatch):
    monkeypatch.delitem(REGISTRY, "ia3")  # restored after the test
    with pytest.raises(AdapterSpecError, match="defaults for fields that do not apply"):
        register(type("B1", (Method,), {"name": "ia3", "summary": "x", "peft_type": None, "defaults": {"rank": 1}}))
    with pytest.raises(AdapterSpecError, match="exactly when the method lists inits"):
        register(type("B2", (Method,), {"name": "ia3", "summary": "x", "peft_type": None, "fields": ("init",)}))


@pytest.mark.parametrize("adapter,field", [
    ({"method": "ia3", "init": "pissa"}, "adapter.init='pissa' does not apply to method 'ia3'"),
    ({"method": "full", "rank": 32}, "adapter.rank=32 does not apply to method 'full'"),
    ({"method": "vera", "alpha": 16}, "adapter.alpha=16.0 does not apply to method 'vera'"),
    ({"method": "lora", "mask": "safe"}, "adapter.mask='safe' does not apply to method 'lora'"),
    ({"method": "full", "mask_alpha": 0.3}, "adapter.mask_alpha=0.3 does not apply to method 'full'"),
    ({"method": "lora", "lr_ratio": 4}, "adapter.lr_ratio=4.0 does not apply to method 'lora'"),
    ({"method": "ln_tuning", "target_modules": ["q_proj"]}, "does not apply to method 'ln_tuning'"),
])
def test_fields_that_do_not_apply_are_rejected_by_name(adapter, field):
    with pytest.raises(ValueError, match="Fields that apply to") as e:
        AdapterConfig(**adapter)
    assert field in str(e.value)


def test_unknown_names_list_the_allowed_values():
    for kw, allowed in (({"method": "lorax"}, "allowed: full, lora"), ({"init": "svd"}, "allowed: kaiming"),
                        ({"method": "full", "mask": "top"}, "allowed: principal")):
        with pytest.raises(ValueError, match=allowed):
            AdapterConfig(**kw)


def test_null_fields_resolve_to_method_defaults():
    assert check_config({"method": "lora"}) == {"method": "lora", "rank": 8, "alpha": 16.0, "dropout": 0.0,
                                                "target_modules": "all-linear", "init": "kaiming"}
    assert check_config({"method": "lora", "rank": 32})["alpha"] == 64.0  # alpha defaults to 2r
    assert check_config({"method": "lora_plus"})["lr_ratio"] == 16.0
    assert check_config({"method": "full"}) == {"method": "full", "mask": None}
    assert check_config({"method": "full", "mask": "safe"})["mask_alpha"] == 0.5
    assert check_config({"method": "ln_tuning"}) == {"method": "ln_tuning"}


def test_study_error_names_field_and_allowed_values():
    raw = {"name": "t", "defaults": {"adapter": {"method": "lora", "init": "pissa"}},
           "axes": {"m": {"field": "adapter.method", "values": ["lora", "ia3"]}}}
    with pytest.raises(StudyError) as e:
        study_cells(parse_study(raw))
    msg = str(e.value)
    assert "adapter.init='pissa' does not apply to method 'ia3'" in msg and "Fields that apply to ia3" in msg


def test_config_import_stays_light():
    code = "import sys, lorarl.language.config as c; c.CellConfig(); print('torch' in sys.modules, 'peft' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ---------------------------------------------------------------------------------------------
# studies
# ---------------------------------------------------------------------------------------------

PEFT_ROWS = ["full", "lora", "adalora", "dora", "miss", "lora_fa", "vera", "lora_plus", "rslora", "milora",
             "pissa", "ia3", "ln_tuning"]
GEOMETRY_INITS = ["gaussian", "pissa", "milora", "olora", "olora_tail", "rlpo", "rlmo", "dct", "wavelet"]


@pytest.mark.parametrize("name", ["peft_zoo", "peft_zoo_cpu"])
def test_peft_zoo_studies_have_the_13_rows(name):
    cells = study_cells(load_study(REPO / "experiments" / f"{name}.yaml"))
    assert [c.axes["method"] for c in cells if c.axes.get("seed", "0") == "0"] == PEFT_ROWS
    by = {c.axes["method"]: c.config for c in cells}
    assert by["pissa"].adapter.init == "pissa" and by["pissa"].adapter.method == "lora"
    assert by["full"].adapter.rank is None and by["ia3"].adapter.alpha is None
    applied = {m: check_config(c.adapter.model_dump()) for m, c in by.items()}
    ranks = {applied[m].get("rank") for m in PEFT_ROWS if "rank" in applied[m]}
    assert len(ranks) == 1  # one rank for every method that has one
    assert all(c.train.loss_type == "dapo" and c.train.epsilon_high == 0.28 and c.train.beta == 0 for c in by.values())
    if name == "peft_zoo":
        lora = by["lora"]
        assert (lora.adapter.rank, lora.adapter.alpha, lora.adapter.dropout, lora.train.lr, lora.train.generations) \
            == (32, 64.0, 0.05, 1e-5, 8)


@pytest.mark.parametrize("name, seeds", [("init_geometry", 3), ("init_geometry_cpu", 1)])
def test_init_geometry_studies_cross_nine_inits_with_two_schedules(name, seeds):
    cells = study_cells(load_study(REPO / "experiments" / f"{name}.yaml"))
    assert len(cells) == 18 * seeds  # 9 inits x 2 schedules x seeds (the study has 3, its CPU twin 1)
    assert len({c.config.seed for c in cells}) == seeds
    assert list(dict.fromkeys(c.axes["init"] for c in cells)) == GEOMETRY_INITS
    assert {c.config.train.lr_scheduler for c in cells} == {"constant", "cosine"}
    assert all(c.config.adapter.method == "lora" for c in cells)
    if name == "init_geometry":
        c = cells[0].config
        assert (c.adapter.rank, c.adapter.alpha, c.train.lr, c.train.weight_decay) == (16, 32.0, 1e-5, 0.1)


def test_lorarl_cells_lists_the_cpu_twin():
    out = subprocess.run([sys.executable, "-m", "lorarl.cli", "cells", str(REPO / "experiments" / "peft_zoo_cpu.yaml"),
                          "--ids"], capture_output=True, text=True, check=True).stdout.split()
    assert out == PEFT_ROWS
