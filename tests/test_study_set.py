"""`--config set=...` (lorarl.study_set): a shipped study shrunk for one run, its matrix and adaptive blocks as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lorarl.language.study import StudyError, cell_table, load_study
from lorarl.study_set import effective_file
from tests.support.snakemake import run_snakemake

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "experiments" / "demo_adaptive.yaml"
SMALL = {"model": "local:tiny-test", "train.steps": 4, "eval.eval_every": 2, "task.n_eval": 8}


def test_set_overrides_the_defaults_and_keeps_the_matrix(tmp_path: Path):
    out = effective_file(DEMO, SMALL, tmp_path)
    assert out == tmp_path / "demo_adaptive" / "study_set.yaml"
    shipped, small = load_study(DEMO), load_study(out)
    assert [c.id for c in cell_table(small).cells] == [c.id for c in cell_table(shipped).cells]
    assert small.search == shipped.search and small.hypotheses == shipped.hypotheses and small.axes == shipped.axes
    cfg = cell_table(small).cell("r8-kl0-s0").config
    assert (cfg.model, cfg.train.steps, cfg.eval.eval_every, cfg.task.n_eval, cfg.task.n_train) == (
        "local:tiny-test", 4, 2, 8, 2000)  # what set names changes, the rest is the file's
    assert cell_table(small).cell("r8-kl0-s0").hash != cell_table(shipped).cell("r8-kl0-s0").hash
    mtime = out.stat().st_mtime_ns
    assert effective_file(DEMO, SMALL, tmp_path) == out and out.stat().st_mtime_ns == mtime  # unchanged: not rewritten
    assert effective_file(DEMO, {}, tmp_path) == DEMO and effective_file(DEMO, None, tmp_path) == DEMO
    # `--config set='{"train.steps": 4}'`: Snakemake hands every scalar over as text; read as YAML, the same study
    texts = {k: str(v) for k, v in SMALL.items()}
    assert load_study(effective_file(DEMO, texts, tmp_path / "cli")).model_dump() == small.model_dump()


@pytest.mark.parametrize("bad, says", [
    ({"adapter.rank": 2}, "set.adapter.rank: the axis 'rank'"),  # an axis's field: the matrix stays
    ({"train.beta": 0.1}, "set.train.beta: the axis 'kl'"),
    ({"train.stepz": 4}, "'stepz' is not a field of train; allowed: lr, steps"),
    ({"search.eta": 3}, "'search' is not a field of the cell config"),  # the adaptive blocks are the file's
    ({"train.steps": "four"}, "defaults.train.steps"),
    ([4], "allowed: a mapping of study default fields"),
])
def test_a_bad_set_is_refused_before_anything_is_written(tmp_path: Path, bad, says):
    with pytest.raises(StudyError) as err:
        effective_file(DEMO, bad, tmp_path)
    assert says in str(err.value)
    assert not (tmp_path / "demo_adaptive").exists()


def test_snakemake_refuses_a_bad_set_with_exit_2(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"studies": [str(DEMO)], "results": "results", "launcher": "local", "set": {"adapter.rank": 2}}))
    proc = run_snakemake(tmp_path, "-n", "all", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "set.adapter.rank: the axis 'rank'" in proc.stderr and not (tmp_path / "results").exists()
