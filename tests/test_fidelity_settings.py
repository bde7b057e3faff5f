"""Settings the published studies take from their papers where lorarl's defaults differ (each row cites
where the paper says it, or why lorarl chose where it is silent; the fidelity table of the study says the same)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.study import load_study, study_cells

ROOT = Path(__file__).resolve().parents[1]

# (study, cell filter: axis -> labels (None: every cell), dotted field, value, where)
ROWS = [
    ("init_geometry", None, "train.prompt_overflow", "truncate_left", "003 App. C.1: left truncation at 512"),
    ("init_geometry_7b", None, "train.prompt_overflow", "truncate_left", "003 at 7B: as at 1.5B"),
    ("init_geometry_7b", None, "train.loss_type", "dapo", "003 trains in verl: token-mean loss aggregation"),
    ("init_geometry_7b", None, "train.kl_importance_correction", False, "verl's KL loss has no pi/pi_old weight"),
    ("peft_zoo", None, "train.prompt_overflow", "truncate_left", "002 §2.4: TRL of the time cut prompts left"),
    ("peft_zoo", {"method": ["lora", "dora", "rslora", "lora_fa", "lora_plus"]}, "adapter.init", "kaiming",
     "002 silent (Table 1 names two inits): one A init for the family, the authors' code's peft default"),
    ("peft_zoo", {"method": ["vera"]}, "adapter.target_modules", ["q_proj", "v_proj"], "002 Table 4: VeRA 0.0029% = q/v"),
    ("peft_zoo_7b", {"method": ["lora", "dora", "lora_plus"]}, "adapter.init", "kaiming", "as peft_zoo"),
    ("peft_zoo_ablations", None, "adapter.init", "kaiming", "as peft_zoo"),
    ("off_principal_masks", None, "train.prompt_overflow", "truncate_left", "004 silent: verl's DAPO recipe"),
    ("off_principal_lora_pissa", None, "train.prompt_overflow", "truncate_left", "004 silent: verl's DAPO recipe"),
    ("off_principal_lora_pissa", None, "eval.eval_every", 20, "004 Figs. 10-11: the held-out curve (collapses early)"),
    ("kl_free", None, "train.lr_scheduler", "linear", "000 silent: TRL's default schedule"),
    ("kl_free_gemma_ablation", None, "train.lr_scheduler", "linear", "000 silent: TRL's default schedule"),
]


@pytest.mark.parametrize("study, where, field, value, why", ROWS, ids=[f"{r[0]}:{r[2]}" for r in ROWS])
def test_published_setting(study, where, field, value, why):
    cells = study_cells(load_study(str(ROOT / "experiments" / f"{study}.yaml")))
    chosen = [c for c in cells if where is None or all(c.axes.get(a) in labels for a, labels in where.items())]
    assert chosen, (study, where)
    for cell in chosen:
        obj = cell.config
        for part in field.split("."):
            obj = getattr(obj, part)
        assert obj == value, (cell.id, field, why)
