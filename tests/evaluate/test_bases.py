"""Base pseudo-cells per prompt (issue 11): a study with a prompt axis evaluates the untrained model
once per distinct prompt (base evaluation signature), not under the first cell's prompt only; the
aggregate table and the report label each base row with its prompt."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from lorarl import paths
from lorarl.report.aggregate import base_table, markdown, seed_table
from lorarl.cli import main
from lorarl.evaluate.main import requested_targets
from lorarl.language.study import cell_table, load_study
from lorarl.language.signature import short_hash

ASK = "Solve this.\n{question}\nEnd with \\boxed{}."


def _study(tmp_path, axes: dict, name: str = "prompts", defaults: dict | None = None):
    raw = {"name": name, "defaults": {"train": {"steps": 2}, **(defaults or {})}, "axes": axes}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


PROMPT_AXIS = {"prefix": "p", "values": [
    {"label": "raw", "set": {"prompt.template": "{question}"}},
    {"label": "ask", "set": {"prompt.template": ASK, "prompt.system": "You are careful."}}]}
RANK_AXIS = {"field": "adapter.rank", "prefix": "r", "values": [1, 8]}
SEED_AXIS = {"field": "seed", "prefix": "s", "values": [0, 1]}


def test_one_base_per_prompt(tmp_path, capsys):
    path = _study(tmp_path, {"rank": RANK_AXIS, "prompt": PROMPT_AXIS, "seed": SEED_AXIS})
    table = cell_table(load_study(path))
    assert len(table.cells) == 8 and table.base_ids == ["base-praw", "base-pask"]
    for b in table.bases:
        members = [c for c in table.cells if c.axes["prompt"] == b.axes["prompt"]]
        assert len(members) == 4 and all(c.config.prompt == b.config.prompt for c in members)
        assert b.config.seed == 0 and b.axes == {"model": "local:tiny-arith", "prompt": b.id.removeprefix("base-p")}
        assert table.is_base(b.id) and table.cell(b.id) is b
        assert requested_targets(b.config, True) == [("synthetic", None)]
    raw, ask = table.bases
    assert raw.config.prompt.template == "{question}" and ask.config.prompt.template == ASK
    assert table.eval_signature("base-praw", "synthetic") != table.eval_signature("base-pask", "synthetic")
    assert raw.hash != ask.hash
    assert main(["cells", str(path)]) == 0
    assert "base pseudo-cells: base-praw, base-pask" in capsys.readouterr().out


def test_one_prompt_keeps_one_base_named_as_before(tmp_path):
    table = cell_table(load_study(_study(tmp_path, {"rank": RANK_AXIS, "seed": SEED_AXIS})))
    assert table.base_ids == ["base"]                       # a seed axis never splits the base
    assert table.bases[0].hash == short_hash({"base_model": "local:tiny-arith"})
    assert table.bases[0].axes == {"model": "local:tiny-arith"}


def test_models_and_prompts_and_combined_axes(tmp_path):
    model_axis = {"field": "model", "prefix": "m", "values": ["local:tiny-arith", "local:tiny-test"]}
    t = cell_table(load_study(_study(tmp_path, {"model": model_axis, "prompt": PROMPT_AXIS}, "two")))
    assert t.base_ids == ["base-tiny-arith-praw", "base-tiny-arith-pask", "base-tiny-test-praw",
                          "base-tiny-test-pask"]
    # two prompt settings from two axes: their labels together name the four bases
    chat = {"field": "prompt.chat_template", "prefix": "c", "values": ["on", "off"]}
    t = cell_table(load_study(_study(tmp_path, {"prompt": PROMPT_AXIS, "chat": chat}, "combo")))
    assert t.base_ids == ["base-praw-con", "base-praw-coff", "base-pask-con", "base-pask-coff"]
    # an evaluation setting splits the base too (it changes what the base is asked)
    budget = {"field": "eval.max_new_tokens", "prefix": "t", "values": [16, 32]}
    t = cell_table(load_study(_study(tmp_path, {"budget": budget, "rank": RANK_AXIS}, "budget")))
    assert t.base_ids == ["base-t16", "base-t32"]
    # ... while a training-only axis never does
    lr = {"field": "train.lr", "prefix": "lr", "values": [1e-3, 1e-4]}
    assert cell_table(load_study(_study(tmp_path, {"lr": lr}, "lr"))).base_ids == ["base"]


def _summary(results, study, cell, value):
    p = paths.path("eval_summary", results=results, study=study, cell=cell, benchmark="synthetic")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"benchmark": "synthetic", "n_problems": 10, "metrics": {
        "pass@1": {"value": value, "ci_low": value - 0.1, "ci_high": value + 0.1}}}))


def test_aggregate_shows_a_base_row_per_prompt(tmp_path):
    study = load_study(_study(tmp_path, {"rank": RANK_AXIS, "prompt": PROMPT_AXIS, "seed": SEED_AXIS}))
    res = tmp_path / "results"
    _summary(res, study.name, "base-praw", 0.25)
    _summary(res, study.name, "base-pask", 0.5)
    base = base_table(study, res)
    assert list(base["cell"]) == ["base-praw", "base-pask"] and list(base["prompt"]) == ["raw", "ask"]
    assert list(base["synthetic/pass@1"]) == [0.25, 0.5]
    assert list(base["base"]) == ["base (local:tiny-arith, prompt=raw)", "base (local:tiny-arith, prompt=ask)"]
    cells = pd.DataFrame([{"cell": c.id, **c.axes, "final_train_reward": 0.5, "synthetic/pass@1": 0.75}
                          for c in cell_table(study).cells])
    md = markdown(study, seed_table(study, cells), base)
    assert "| base (local:tiny-arith, prompt=raw) | raw | – | 0.250 | – |" in md   # rank | prompt | reward | pass@1
    assert "| base (local:tiny-arith, prompt=ask) | ask | – | 0.500 | – |" in md
    from lorarl.report import build  # the report page: its base table, one row per prompt (no cell done yet)

    page = build(study._source, res)["report"].read_text()
    assert "base model (untrained), one row per model and prompt" in page
    assert "base (local:tiny-arith, prompt=raw)" in page and "base (local:tiny-arith, prompt=ask)" in page


@pytest.mark.slow
def test_dry_run_plans_one_base_evaluation_per_prompt(tmp_path):
    """`snakemake -n all` on a study with a prompt axis: each prompt's base is evaluated, once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).parents[2]
    study = _study(tmp_path, {"prompt": PROMPT_AXIS, "seed": SEED_AXIS})
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--quiet", "host", "all",
                           "--directory", str(tmp_path), "--configfile", str(repo / "config" / "config.yaml"), "--config", f"studies={json.dumps([str(study)])}",
                           "results=results"], cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    for base in ("base-praw", "base-pask"):
        assert f"results/prompts/{base}/eval/synthetic.json" in out
        assert len([ln for ln in out.splitlines() if "lorarl launch evaluate" in ln and f" {base}" in ln]) == 1
    assert "results/prompts/base/" not in out
