"""The study language of adaptive studies: `search:` and `hypotheses:` are validated like every other
field (a bad value exits 2 from `lorarl cells`, naming the field and what is allowed, writing nothing),
their defaults resolve from the study, and neither block changes any cell's id or signature."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lorarl.language.adaptive.blocks import resolved_search
from lorarl import badstudies
from lorarl.badstudies import with_field
from lorarl.language.study import cell_table, load_study
from tests.support.study import tiny_study

BASE = {**tiny_study("ad", task={"name": "synthetic", "n_train": 16, "n_eval": 8},
                     adapter={"method": "lora", "rank": 2, "alpha": 4},
                     train={"steps": 12, "prompts_per_step": 2, "generations": 2, "lr": 1.0e-3},
                     eval={"max_new_tokens": 8, "eval_every": 2},
                     axes={
                      "rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 2, 4]},
                      "kl": {"field": "train.beta", "prefix": "kl", "values": [0.0, 0.05]},
                      "seed": {"field": "seed", "prefix": "s", "values": [0, 1]},
                  }),
        "search": {"rule": "sha", "rungs": [2, 6], "eta": 3, "min_kept": 1},
        "hypotheses": {"r4_beats_r1": {"kind": "superiority", "a": {"rank": 4, "kl": 0}, "b": {"rank": 1, "kl": 0}}}}


def _with(path: str, value, base: dict | None = None) -> dict:
    return with_field(path, value, base or BASE)


def _write(tmp_path: Path, d: dict) -> Path:
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return f


H = "hypotheses.r4_beats_r1"
BAD = [  # (name, study, a fragment the message must contain)
    ("rule unknown", _with("search.rule", "hyperband"), "search.rule"),
    ("eta 1", _with("search.eta", 1), "search.eta"),
    ("eta text", _with("search.eta", "three"), "search.eta"),
    ("eta boolean", _with("search.eta", True), "search.eta"),
    ("eta a quoted number", _with("search.eta", "3"), "search.eta"),
    ("eta a float", _with("search.eta", 3.0), "search.eta"),
    ("min_kept a quoted number", _with("search.min_kept", "1"), "search.min_kept"),
    ("rung a quoted number", _with("search.rungs", ["2", 6]), "search.rungs"),
    ("min_kept 0", _with("search.min_kept", 0), "search.min_kept"),
    ("min_kept keeps every setting", _with("search.min_kept", 6), "search.min_kept: 6 keeps every one"),
    ("min_kept above the settings", _with("search.min_kept", 9), "search.min_kept"),
    ("direction unknown", _with("search.direction", "up"), "search.direction"),
    ("unknown search field", _with("search.etta", 2), "search.etta"),
    ("search not a mapping", _with("search", [2, 6]), "search"),
    ("rungs empty", _with("search.rungs", []), "search.rungs"),
    ("rungs unsorted", _with("search.rungs", [6, 2]), "search.rungs"),
    ("rung zero", _with("search.rungs", [0, 2]), "search.rungs"),
    ("rung at the last step", _with("search.rungs", [2, 12]), "search.rungs"),
    ("rung past the last step", _with("search.rungs", [20]), "search.rungs"),
    ("rung without a snapshot", _with("search.rungs", [3]), "search.rungs"),
    ("rungs without snapshots", _with("defaults.eval.eval_every", 0), "search.rungs"),
    ("derived rungs without snapshots", _with("defaults.eval.eval_every", 0, _with("search.rungs", None)),
     "search.rungs"),
    ("metric not benchmark/metric", _with("search.metric", "accuracy"), "search.metric"),
    ("metric of an unevaluated benchmark", _with("search.metric", "gsm8k/pass@1"), "search.metric"),
    ("metric not of the protocol", _with("search.metric", "synthetic/pass@8"), "search.metric"),
    ("paired axis unknown", _with("search.paired", ["sed"]), "search.paired"),
    ("kind unknown", _with(f"{H}.kind", "better"), f"{H}.kind"),
    ("kind missing", _with(H, {"a": {"rank": 4, "kl": 0}, "b": {"rank": 1, "kl": 0}}), f"{H}.kind"),
    ("margin negative", _with(f"{H}.margin", -0.01), f"{H}.margin"),
    ("non-inferiority without margin", _with(f"{H}.kind", "non_inferiority"), H),
    ("equivalence without margin", _with(f"{H}.kind", "equivalence"), H),
    ("alpha 0", _with(f"{H}.alpha", 0), f"{H}.alpha"),
    ("alpha 0.7", _with(f"{H}.alpha", 0.7), f"{H}.alpha"),
    ("alpha a quoted number", _with(f"{H}.alpha", "0.05"), f"{H}.alpha"),
    ("margin a quoted number", _with(f"{H}.margin", "0.02"), f"{H}.margin"),
    ("max_seeds a quoted number", _with(f"{H}.max_seeds", "4"), f"{H}.max_seeds"),
    ("min_seeds a quoted number", _with(f"{H}.min_seeds", "3"), f"{H}.min_seeds"),
    ("spending a quoted number", _with(f"{H}.spending", "1.5"), f"{H}.spending"),
    ("min_seeds 1", _with(f"{H}.min_seeds", 1), f"{H}.min_seeds"),
    ("max_seeds 500", _with(f"{H}.max_seeds", 500), f"{H}.max_seeds"),
    ("min_seeds above max_seeds", _with(f"{H}.min_seeds", 8, _with(f"{H}.max_seeds", 4)), H),
    ("spending 0", _with(f"{H}.spending", 0), f"{H}.spending"),
    ("unknown hypothesis field", _with(f"{H}.margn", 0.1), f"{H}.margn"),
    ("a names an unknown axis", _with(f"{H}.a", {"rnak": 4, "kl": 0}), f"{H}.a"),
    ("a names the seed axis", _with(f"{H}.a", {"rank": 4, "kl": 0, "seed": 0}), f"{H}.a"),
    ("a names an unknown label", _with(f"{H}.a", {"rank": 64, "kl": 0}), f"{H}.a.rank"),
    ("a leaves an axis open", _with(f"{H}.a", {"rank": 4}), f"{H}.a"),
    ("a is b", _with(f"{H}.a", {"rank": 1, "kl": 0}), H),
    ("b empty", _with(f"{H}.b", {}), f"{H}.b"),
    ("metric of an unevaluated benchmark", _with(f"{H}.metric", "math500/pass@1"), f"{H}.metric"),
    ("hypothesis name unsafe", _with("hypotheses", {"a b": BASE["hypotheses"]["r4_beats_r1"]}), "hypotheses"),
    ("no seed axis to pair by", _with("seed_axis", "replicate", _with("search", None)), "hypotheses: pair by seed"),
    ("search pairs by a missing seed axis", _with("seed_axis", "replicate"), "search.paired"),
]


@pytest.mark.parametrize("name,study,place", BAD, ids=[b[0] for b in BAD])
def test_each_bad_block_is_refused_cleanly(name, study, place, tmp_path: Path):
    case = badstudies.Case("adaptive", name, yaml.safe_dump(study, sort_keys=False), place)
    result = badstudies.check(case, tmp_path)
    assert result.problems == [], result.message


def test_a_quoted_number_is_refused_naming_what_is_allowed(tmp_path: Path):
    from lorarl.language.study import StudyError

    with pytest.raises(StudyError, match=r"search\.eta: '3' is text \(quoted\); allowed: an integer without quotes"):
        load_study(_write(tmp_path, _with("search.eta", "3")))
    with pytest.raises(StudyError, match=rf"{H}\.alpha: '0\.05' is text \(quoted\); allowed: a number without"):
        load_study(_write(tmp_path, _with(f"{H}.alpha", "0.05")))
    study = load_study(_write(tmp_path, _with("search.min_kept", 5, _with(f"{H}.margin", 0))))  # 5 of 6: fine
    assert study.search.min_kept == 5 and study.hypotheses["r4_beats_r1"].margin == 0.0  # an int where a float goes


def test_a_valid_study_resolves_the_defaults(tmp_path: Path):
    d = _with("search", {"rule": "asha", "eta": 2})
    study = load_study(_write(tmp_path, d))
    spec = resolved_search(study, cell_table(study))
    assert spec.rungs == [2, 4, 8]  # eval_every x eta^k below train.steps 12
    assert spec.metric == "synthetic/pass@1" and spec.paired == ["seed"] and spec.rule == "asha"
    h = study.hypotheses["r4_beats_r1"]
    assert (h.kind, h.margin, h.alpha, h.min_seeds, h.max_seeds, h.spending) == ("superiority", 0.0, 0.05, 3, 12, 1.5)


def test_a_bad_block_names_its_yaml_line(tmp_path: Path):
    from lorarl.language.study import StudyError

    with pytest.raises(StudyError, match=r"search\.rungs: step 3 has no held-out snapshot.*\(line \d+\)"):
        load_study(_write(tmp_path, _with("search.rungs", [3])))


def test_neither_block_changes_any_cell_signature(tmp_path: Path):
    """The blocks are study-level decisions: ids, training and evaluation signatures of every cell (and the
    base) are the same with or without them, and with other values in them."""
    def signs(d: dict, sub: str) -> list:
        (tmp_path / sub).mkdir()
        study = load_study(_write(tmp_path / sub, d))
        table = cell_table(study)
        return [(c.id, c.hash, c.eval_hash, table.eval_signature(c.id, "synthetic", 2)) for c in table.cells] + \
               [(b.id, b.hash, b.eval_hash) for b in table.bases]

    plain = {k: v for k, v in BASE.items() if k not in ("search", "hypotheses")}
    other = _with("search", {"rule": "asha", "rungs": [4], "eta": 2, "direction": "min"},
                  _with(f"{H}.kind", "equivalence", _with(f"{H}.margin", 0.05)))
    ref = signs(plain, "plain")
    assert len(ref) == 13
    assert signs(BASE, "blocks") == ref
    assert signs(other, "other") == ref


def test_the_shipped_adaptive_demo_loads_and_its_hypotheses_add_seeds():
    """experiments/demo_adaptive.yaml: both blocks, and a hypothesis whose first look needs a seed the axis
    does not list (its cells are the added seeds lorarl.language.adaptive.seeds plans)."""
    from lorarl.language.adaptive.seeds import comparison_seeds

    study = load_study(Path(__file__).resolve().parents[2] / "experiments" / "demo_adaptive.yaml")
    table = cell_table(study)
    assert study.search is not None and len(table.cells) == 4
    listed = {c.id for c in table.cells}
    for name, h in study.hypotheses.items():
        seeds = comparison_seeds(study, table, h)
        assert len(seeds) == h.max_seeds > len(study.axes[study.seed_axis].values)
        added = {c for _, a, b in seeds for c in (a, b)} - listed
        assert added and all(c.endswith(("-s1", "-s2")) for c in added), (name, added)
