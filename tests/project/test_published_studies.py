"""Every published study (experiments/*.yaml except the CPU twins and the demo) begins with a
fidelity table against its paper and still expands into cells; every CPU twin names its study."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lorarl.models import RECIPES, recipe_name
from lorarl.rewards.registry import extra_models
from lorarl.language.study import load_study, study_cells

from tests.support.published import EXPERIMENTS, PUBLISHED, REQUIRED, TWINS, fidelity_table


def test_published_studies_exist():
    names = {p.stem for p in PUBLISHED}
    assert {"kl_free", "kl_bound_toy", "reward_density", "peft_zoo", "init_geometry"} <= names
    assert len(PUBLISHED) >= 9  # plus the studies added for papers 000, 002, 003 and 004


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_published_study_has_fidelity_table_and_expands(path):
    rows = fidelity_table(path)
    missing = [r for r in REQUIRED if r not in rows]
    assert not missing, f"{path.name}: fidelity table lacks rows {missing}"
    for name, cells in rows.items():
        assert len(cells) == 3 and all(cells), f"{path.name}: row {name!r} needs paper | this file | note"
    assert re.search(r"paper 00[0-4]", path.read_text()[:600]), f"{path.name}: name its paper (paper 00N)"
    cells = study_cells(load_study(path))
    assert cells and len({c.id for c in cells}) == len(cells)


def test_fidelity_table_parser_rejects_incomplete_tables(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# paper 000\n# | setting | paper (section/table) | this file | note |\n# |---|---|---|---|\n"
                   "# | model | §5 | x | y |\nname: bad\n")
    rows = fidelity_table(bad)
    assert list(rows) == ["model"] and [r for r in REQUIRED if r not in rows]
    (tmp_path / "none.yaml").write_text("# nothing here\nname: none\n")
    with pytest.raises(AssertionError, match="no fidelity table"):
        fidelity_table(tmp_path / "none.yaml")


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.stem)
def test_cpu_twin_names_its_published_study(path):
    study = EXPERIMENTS / f"{path.stem[:-4]}.yaml"
    assert study.exists(), f"{path.name} has no published study {study.name}"
    assert study.name in path.read_text()[:800]


# ---- CPU twins (issue 11): every published study has one, with its axes, on local models only ----

# The published studies with no CPU twin of their own: the toy runs here as it is (a CPU study).
NO_TWIN = {"kl_bound_toy": "runs on the CPU itself (paper 000 §5.1's toy)"}
# Axes a twin leaves out, each with the reason its header gives.
DROPPED_AXES = {"kl_free_cpu": {"model": "one local model stands for the three model families"}}


def _axes(path: Path) -> dict[str, int]:
    """axis name -> number of values, as the study file declares them."""
    return {name: len(axis.values) for name, axis in load_study(path).axes.items()}


def test_every_published_study_has_a_cpu_twin():
    missing = [p.name for p in PUBLISHED if p.stem not in NO_TWIN
               and not (EXPERIMENTS / f"{p.stem}_cpu.yaml").exists()]
    assert not missing, f"published studies without a CPU twin: {missing}"


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.stem)
def test_cpu_twin_keeps_its_study_axes_on_local_models(path):
    study = EXPERIMENTS / f"{path.stem[:-4]}.yaml"
    published, twin = _axes(study), _axes(path)
    # The shape: every axis of the study is an axis of the twin (a twin may run fewer seeds)
    lost = [a for a in published if a not in twin and a not in DROPPED_AXES.get(path.stem, {})]
    assert not lost, f"{path.name} drops axes {lost} of {study.name}"
    for name, n in published.items():
        if name != "seed" and path.stem in NEW_TWINS:
            assert twin[name] == n, f"{path.name}: axis {name} has {twin[name]} values, {study.name} {n}"
    # Runnable here: every cell's model (and distillation teacher) is a locally built recipe, no hub data
    cells = study_cells(load_study(path))
    assert cells and len({c.id for c in cells}) == len(cells)
    for c in cells:
        assert recipe_name(c.config.model) in RECIPES, f"{path.name} {c.id}: model {c.config.model}"
        for x in extra_models(c.config.reward):  # the distillation teacher: built locally
            assert not x.local_recipe or recipe_name(x.model) in RECIPES, f"{path.name} {c.id}: {x.field} {x.model}"
        assert c.config.task.name == "synthetic", f"{path.name} {c.id}: task {c.config.task.name}"


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.stem)
def test_cpu_twin_header_says_what_was_shrunk_and_what_it_measured(path):
    head = "\n".join(l for l in path.read_text().splitlines() if l.startswith("#"))
    assert re.search(r"shrunk|scaled down", head, re.I), f"{path.name}: no fidelity header (what was shrunk)"
    m = re.search(r"^# measured\b", head, re.M)
    assert m and not re.search(r"^# measured.*pending", head, re.M), f"{path.name}: no '# measured' line (date, how, numbers)"


NEW_TWINS = {"kl_free_gemma_ablation_cpu", "peft_zoo_ablations_cpu", "peft_zoo_7b_cpu", "init_geometry_7b_cpu",
             "off_principal_masks_cpu", "off_principal_lora_pissa_cpu"}


def test_distillation_teacher_is_stronger_and_shares_the_student_tokenizer():
    """Paper 001's teacher is an answer-producing model stronger than the student, sharing its vocabulary:
    reward_density_cpu's teacher continues the student's SFT on boxed answers only (tokenizer and shape
    inherited), so it scores the student's exact token ids."""
    cfg = study_cells(load_study(EXPERIMENTS / "reward_density_cpu.yaml"))
    distill = [c.config for c in cfg if c.config.reward.regime == "distillation"]
    assert distill
    student, teacher = recipe_name(distill[0].model), recipe_name(distill[0].reward.teacher)
    assert teacher != student and RECIPES[teacher].init_from == student
    assert RECIPES[teacher].p_unboxed == 0.0 and RECIPES[teacher].sft_steps > 0   # it always boxes its answer


def test_reward_density_evaluates_the_teacher_as_a_base_row():
    """Paper 001 Table 2's teacher column: the teacher is a base row on math500_envelope only."""
    from lorarl.language.study import base_cells, load_study

    bases = {b.id: b for b in base_cells(load_study("experiments/reward_density.yaml"))}
    t = bases["teacher-Qwen3-8B"]
    assert t.config.model == "Qwen/Qwen3-8B" and list(t.config.eval.benchmarks) == ["math500_envelope"]
    assert bases["base"].config.model == "Qwen/Qwen3-1.7B-Base" and t.hash != bases["base"].hash


def test_init_geometry_diagnoses_snapshots_through_training_without_evaluating_them():
    """Paper 003 Fig. 7 (subspace similarity "throughout training"): snapshots every 100 of the 500 steps,
    diagnosed by the diagnose stage (lorarl.diagnose.main walks snapshot_steps), at no evaluation cost."""
    from lorarl.language.evalplan.plan import eval_targets, snapshot_steps
    from lorarl.language.study import load_study, study_cells

    cfg = study_cells(load_study(EXPERIMENTS / "init_geometry.yaml"))[0].config
    assert snapshot_steps(cfg) == [100, 200, 300, 400]
    assert all(step is None for _, step in eval_targets(cfg))


# The sampler each paper used (docs/gpus.md#the-sampler-per-study): 002-004 name vLLM, 000 and 001 name no engine.
SAMPLERS = {"kl_free": "hf", "kl_free_gemma_ablation": "hf", "reward_density": "hf", "peft_zoo": "vllm",
            "peft_zoo_7b": "vllm", "peft_zoo_ablations": "vllm", "init_geometry": "vllm", "init_geometry_7b": "vllm",
            "off_principal_lora_pissa": "vllm", "off_principal_masks": "vllm"}


def test_every_trained_published_study_says_its_sampler():
    assert {p.stem for p in PUBLISHED} - {"kl_bound_toy"} == set(SAMPLERS)  # a new study declares its sampler here


@pytest.mark.parametrize("stem", sorted(SAMPLERS))
def test_published_study_samples_with_its_papers_engine_and_its_cpu_twin_with_hf(stem):
    path = EXPERIMENTS / f"{stem}.yaml"
    row = fidelity_table(path).get("sampler")
    assert row, f"{path.name}: its fidelity table needs a `sampler` row"
    assert row[1].startswith(f"rollout.engine: {SAMPLERS[stem]}"), row[1]
    assert ("vLLM" in row[0]) == (SAMPLERS[stem] == "vllm"), row[0]  # the paper's words quoted for vLLM, silence otherwise
    assert {c.config.rollout.engine for c in study_cells(load_study(path))} == {SAMPLERS[stem]}
    twin = EXPERIMENTS / f"{stem}_cpu.yaml"
    if twin.exists():  # the CPU twin: HF generate, a different study (the engine is in the signature)
        assert {c.config.rollout.engine for c in study_cells(load_study(twin))} == {"hf"}


def test_the_engine_is_in_the_cells_signature():
    from lorarl.language.signature import train_signature

    cells = study_cells(load_study(EXPERIMENTS / "peft_zoo.yaml"))
    cfg = cells[0].config
    hf = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})})
    assert train_signature(cfg) != train_signature(hf)


def _engine_table(marker: str) -> list[tuple[list[str], str]]:
    """docs/gpus.md's table after ``marker``: each row's study-file patterns and its engine."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / "gpus.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    rows = []
    for line in lines[start + 1:]:
        if rows and not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 4 and cells[2].startswith("`"):
            rows.append((re.findall(r"`([^`]+\.yaml)`", cells[0]), cells[2].strip("`")))
    return rows


@pytest.mark.parametrize("marker, engine_of", [
    ("### The sampler per study", lambda cfg: cfg.rollout.engine),
    ("**The evaluation engine per study.**", lambda cfg: cfg.eval.backend)], ids=["sampler", "evaluation"])
def test_the_engine_tables_of_docs_gpus_say_what_each_study_runs(marker, engine_of):
    """Each study file (twins and demos too) is named by a row of the table, and every row naming it gives the engine
    its cells run with: a study moved to another engine without its docs row fails here."""
    from fnmatch import fnmatch

    rows = _engine_table(marker)
    assert len(rows) >= 5 and any(engine == "vllm" for _, engine in rows)
    for path in sorted(EXPERIMENTS.glob("*.yaml")):
        cells = study_cells(load_study(path))
        if path.stem == "kl_bound_toy":  # trains no model: no engine
            continue
        said = {engine for patterns, engine in rows if any(fnmatch(path.name, p) for p in patterns)}
        assert said, f"{path.name}: no row of docs/gpus.md's table ({marker}) names it"
        assert said == {engine_of(c.config) for c in cells}, f"{path.name}: docs say {said}"
