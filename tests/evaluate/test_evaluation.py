"""Evaluation stage (fast): study-level eval config, targets and rerun signatures, `evaluate_cell`
with a scripted backend (records, MLflow at training steps, one shared base run), snapshots, and
the aggregate's benchmark columns and curve.  No model is loaded; the e2e test trains for real."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from lorarl.language.config import CellConfig, EvalConfig
from lorarl.language.evalplan import plan
from lorarl.evaluate.backends import Completion
from lorarl.grading.protocols import Protocol
from lorarl.grading.resolve import resolve_protocol
from lorarl.language.evalplan.bases import base_label
from lorarl.language.study import StudyError, base_cells, study_cells, load_study
from tests.support.study import tiny_study

GSM8K_ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i}+{i}=<<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i:,}"}
              for i in (1, 2, 3, 600)]


def cell_cfg(eval_: dict | None = None, **over) -> CellConfig:
    return CellConfig.model_validate({"model": "/nonexistent/tiny", "train": {"steps": 10},
                                      "task": {"n_train": 40, "n_eval": 6}, "eval": eval_ or {}, **over})


def write_gsm8k(path) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    return str(path)


# ----------------------------------------------------------------------------- config + plan
def test_default_is_synthetic_final_only():
    c = cell_cfg()
    assert plan.eval_targets(c) == [("synthetic", None)]
    assert plan.snapshot_steps(c) == []
    assert plan.protocol_for("synthetic", plan.benchmark_specs(c)["synthetic"], c.eval) == Protocol.greedy(48)


def test_list_and_mapping_forms_targets_and_steps():
    c = cell_cfg({"benchmarks": ["synthetic", "gsm8k", "math500"], "eval_every": 3,
                  "curve_benchmarks": ["math500"]})
    assert list(c.eval.benchmarks) == ["synthetic", "gsm8k", "math500"]
    assert plan.snapshot_steps(c) == [3, 6, 9]                # step 10 is the final adapter itself
    assert plan.eval_targets(c) == [("synthetic", None), ("gsm8k", None), ("math500", None),
                                    ("math500", 3), ("math500", 6), ("math500", 9)]
    assert plan.eval_targets(c, is_base=True) == [("synthetic", None), ("gsm8k", None), ("math500", None)]
    m = cell_cfg({"benchmarks": {"gsm8k": None, "aime24": {"limit": 5}}, "eval_every": 5})
    assert m.eval.benchmarks["gsm8k"].limit is None and m.eval.benchmarks["aime24"].limit == 5
    assert plan.eval_targets(m)[2:] == [("gsm8k", 5), ("aime24", 5)]  # curve default: every benchmark
    d = cell_cfg({"benchmarks": ["gsm8k"], "eval_every": 5, "curve_benchmarks": []})  # snapshots, diagnosed only
    assert plan.snapshot_steps(d) == [5] and plan.eval_targets(d) == [("gsm8k", None)]
    assert plan.parse_target("gsm8k@40") == ("gsm8k", 40) and plan.parse_target("gsm8k") == ("gsm8k", None)
    with pytest.raises(plan.EvalPlanError):
        plan.parse_target("gsm8k@x")


def _study_error(tmp_path, eval_: dict) -> str:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "bad", "defaults": {"eval": eval_}}))
    with pytest.raises(StudyError) as err:
        load_study(f)
    return str(err.value)


def test_errors_name_the_field_and_allowed_values(tmp_path):
    msg = _study_error(tmp_path, {"benchmarks": ["gsm9k"]})
    assert "eval.benchmarks" in msg and "gsm9k" in msg and "gsm8k, hmmt, math500" in msg
    msg = _study_error(tmp_path, {"benchmarks": {"gsm8k": {"protocol": {"n": 4}}}})
    assert "eval.benchmarks.gsm8k.protocol" in msg and "temperature > 0" in msg
    msg = _study_error(tmp_path, {"benchmarks": {"math500": {"protocol": {"n": 4, "ks": [8]}}}})
    assert "eval.benchmarks.math500.protocol" in msg and "[1, n=4]" in msg
    msg = _study_error(tmp_path, {"benchmarks": {"gsm8k": {"protocol": {"topp": 0.9}}}})
    assert "benchmarks.gsm8k.protocol.topp" in msg and "unknown field" in msg
    msg = _study_error(tmp_path, {"benchmarks": ["gsm8k"], "curve_benchmarks": ["math500"]})
    assert "eval.curve_benchmarks" in msg and "allowed: gsm8k" in msg
    assert "listed twice" in _study_error(tmp_path, {"benchmarks": ["gsm8k", "gsm8k"]})
    assert "is empty" in _study_error(tmp_path, {"benchmarks": []})
    assert "eval_every" in _study_error(tmp_path, {"eval_every": -1})


def test_dataset_task_needs_named_benchmarks(tmp_path):
    task = {"name": "dataset", "path": str(tmp_path / "train.jsonl")}
    with pytest.raises(plan.EvalPlanError, match="eval.benchmarks is required when task.name is 'dataset'"):
        plan.eval_targets(cell_cfg(task=task))
    with pytest.raises(plan.EvalPlanError, match="synthetic needs task.name 'synthetic' or a local `path`"):
        plan.eval_targets(cell_cfg({"benchmarks": ["synthetic"]}, task=task))
    assert plan.eval_targets(cell_cfg({"benchmarks": ["gsm8k"]}, task=task)) == [("gsm8k", None)]


@pytest.mark.parametrize("override, expect", [
    ({}, Protocol.sampling(4)),
    ({"n": 8}, Protocol.sampling(8)),                                        # pass@n follows n
    ({"n": 8, "ks": [1, 8]}, Protocol.sampling(8, ks=(1, 8))),
    ({"temperature": 0}, Protocol.greedy(32768)),                            # family switch keeps budget
    ({"kind": "greedy", "max_new_tokens": 512}, Protocol.greedy(512)),
    ({"top_p": 1.0, "temperature": 1.0}, Protocol.sampling(4, temperature=1.0, top_p=1.0)),
])
def test_protocol_overrides_on_a_sampled_default(override, expect):
    assert resolve_protocol(Protocol.sampling(4), override) == expect


def test_protocol_overrides_on_a_greedy_default_and_global_budget():
    g = Protocol.greedy(4096)
    assert resolve_protocol(g, {"temperature": 0.6, "n": 4}) == Protocol.sampling(4, max_new_tokens=4096)
    assert resolve_protocol(g, {}, max_new_tokens=64) == Protocol.greedy(64)
    assert resolve_protocol(g, {"max_new_tokens": 8}, max_new_tokens=64) == Protocol.greedy(8)
    c = cell_cfg({"max_new_tokens": 40, "benchmarks": ["synthetic", "math500"]})
    specs = plan.benchmark_specs(c)
    assert plan.protocol_for("math500", specs["math500"], c.eval) == Protocol.sampling(4, max_new_tokens=40)


def test_signatures_split_training_from_evaluation():
    a = cell_cfg()
    b = cell_cfg({"benchmarks": ["synthetic", "gsm8k"], "batch_size": 8})
    assert plan.train_signature(a) == plan.train_signature(b)             # adding a benchmark: no retraining
    assert plan.eval_signature(a, "synthetic") == plan.eval_signature(b, "synthetic")  # batch size: memory only
    assert plan.train_signature(cell_cfg({"eval_every": 5})) != plan.train_signature(a)  # snapshots are training output
    assert plan.eval_signature(cell_cfg({"max_new_tokens": 12}), "synthetic") != plan.eval_signature(a, "synthetic")
    lr = cell_cfg(train={"steps": 10, "lr": 0.5})
    assert plan.eval_signature(lr, "synthetic") != plan.eval_signature(a, "synthetic")
    assert plan.eval_signature(lr, "synthetic", is_base=True) == plan.eval_signature(a, "synthetic", is_base=True)
    assert plan.eval_signature(a, "synthetic", 5) != plan.eval_signature(a, "synthetic")


def test_loaders_local_file_field_map_limit_and_synthetic_task(tmp_path):
    from lorarl.evaluate.main import load_problems

    c = cell_cfg({"benchmarks": {"gsm8k": {"path": write_gsm8k(tmp_path / "gsm8k.jsonl"), "limit": 3}}})
    probs = load_problems("gsm8k", c)
    assert [p.gold for p in probs] == ["2", "4", "6"] and "\\boxed{}" in probs[0].prompt
    renamed = [{"q": r["question"], "a": r["answer"]} for r in GSM8K_ROWS]
    (tmp_path / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in renamed))
    c = cell_cfg({"benchmarks": {"gsm8k": {"path": str(tmp_path / "other.jsonl"),
                                           "field_map": {"question": "q", "answer": "a"}}}})
    assert [p.gold for p in load_problems("gsm8k", c)] == ["2", "4", "6", "1200"]  # "1,200" -> 1200
    syn = load_problems("synthetic", cell_cfg())
    from lorarl.tasks import task_records

    assert [p.id for p in syn] == [r["id"] for r in task_records(cell_cfg().task)[1]]
    assert len(syn) == 6 and syn[0].prompt.startswith("Q: ")


def test_requested_targets_and_errors():
    from lorarl.evaluate.main import requested_targets

    c = cell_cfg({"benchmarks": ["synthetic", "gsm8k"], "eval_every": 5})
    assert requested_targets(c, False) == plan.eval_targets(c)  # no --eval-target: all of the cell's
    assert requested_targets(c, False, ["gsm8k@5"]) == [("gsm8k", 5)]
    with pytest.raises(plan.EvalPlanError, match="allowed: synthetic, gsm8k$"):
        requested_targets(c, True, ["gsm8k@5"])                             # the base has no snapshots
    with pytest.raises(plan.EvalPlanError, match="math500"):
        requested_targets(c, False, ["math500"])


# ----------------------------------------------------------------------------- the stage
class OracleBackend:
    """Answers problem i correctly when i is in `right` (by prompt), else nonsense; records calls."""

    def __init__(self, golds: dict[str, str], wrong_every: int = 2):
        self.golds, self.wrong_every, self.calls = golds, wrong_every, []

    def generate(self, prompts, protocol, seed=0):
        self.calls.append((len(prompts), protocol, seed))
        out = []
        for i, p in enumerate(prompts):
            row = []
            for s in range(protocol.n):
                ok = (i + s) % self.wrong_every == 0
                text = f"so \\boxed{{{self.golds[p]}}}" if ok else "no idea"
                row.append(Completion(text, len(text), not ok))
            out.append(row)
        return out


STUDY = tiny_study("evs", adapter=None, model="/nonexistent/tiny", task={"n_train": 40, "n_eval": 6},
                   train={"steps": 10},
                   eval={"eval_every": 5, "curve_benchmarks": ["synthetic"],
                         "benchmarks": {"synthetic": {},
                                        "gsm8k": {"protocol": {"temperature": 0.6, "n": 2, "ks": [1, 2]}}}},
                   axes={"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 2]},
                         "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}})


@pytest.fixture()
def study(tmp_path, monkeypatch):
    """A study file, fake trained cells (adapter + snapshot folders, summary with an MLflow run), and
    `make_backend` replaced by the oracle: evaluate_cell runs without any model."""
    import lorarl.evaluate.main as ev
    from lorarl.language.preflight import SKIP_ENV
    from lorarl.tracking.client import Tracker

    monkeypatch.setenv(SKIP_ENV, "1")  # the model path is never loaded here (the oracle backend)
    raw = json.loads(json.dumps(STUDY))
    raw["defaults"]["eval"]["benchmarks"]["gsm8k"]["path"] = write_gsm8k(tmp_path / "gsm8k.jsonl")
    f = tmp_path / "study.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))  # benchmark order = column order
    s = load_study(f)
    res = tmp_path / "results"
    golds: dict[str, str] = {}
    for name in ("synthetic", "gsm8k"):
        golds.update({p.prompt: p.gold for p in ev.load_problems(name, study_cells(s)[0].config)})
    backend = OracleBackend(golds)
    monkeypatch.setattr(ev, "make_backend", lambda cfg, model, adapter, merge_dir, plan=None, **kw: backend)
    tracker = Tracker(res, s.name)
    for cell in study_cells(s):
        d = res / s.name / cell.id
        for sub in ("adapter", "snapshots/step-5"):
            (d / sub).mkdir(parents=True)
            (d / sub / "adapter_config.json").write_text("{}")
        run = tracker.start(cell.id, cell.id, tags={}, params={})
        tracker.finish()
        r = 1 if cell.axes["rank"] == "1" else 2
        (d / "summary.json").write_text(json.dumps({"mlflow_run_id": run, "final_train_reward": 0.1 * r,
                                                    "wall_time_s": 3.0, "mean_step_time_s": 0.3,
                                                    "trainable_fraction": 0.01 * r}))
        pd.DataFrame({"step": range(1, 11), "reward": [0.1 * i for i in range(10)],
                      "step_time_s": 0.3}).to_csv(d / "metrics.csv", index=False)
    return SimpleNamespace(study=s, file=f, results=res, backend=backend)


def test_evaluate_cell_writes_every_target_and_logs_mlflow_at_steps(study, monkeypatch):
    import mlflow

    from lorarl import jobclock, ledger
    from lorarl.evaluate.main import evaluate_cell
    from lorarl.grading import pool

    cell = study_cells(study.study)[0]
    pool.shutdown_pool()  # a fresh job: its grading workers start beside the model load, waited for before grading
    monkeypatch.setattr(jobclock, "_startup", {})
    ledger.begin(in_process=True)
    out = evaluate_cell(study.study.name, cell, study.results)
    ledger.run_ended()
    assert "grading pool" in jobclock.startup_s()  # the job's start-up, apart from any benchmark's grading
    phases = ledger.record("evaluate", study="evs", cell=cell.id, outcome="completed")["phases_s"]
    assert {"load", "generation", "reward"} <= set(phases)  # the evaluation's phases in its cost record
    assert sorted(out) == ["gsm8k", "synthetic", "synthetic@5"]
    assert out["synthetic"]["pass@1"] == pytest.approx(0.5)         # every second problem right
    assert set(out["gsm8k"]) == {"avg@2", "pass@1", "pass@2"} and out["gsm8k"]["pass@2"] == 1.0
    edir = study.results / "evs" / cell.id / "eval"
    assert sorted(p.name for p in edir.iterdir()) == ["gsm8k.json", "gsm8k.jsonl", "synthetic.json",
                                                       "synthetic.jsonl", "synthetic@5.json", "synthetic@5.jsonl"]
    summ = json.loads((edir / "gsm8k.json").read_text())
    assert summ["n_problems"] == 4 and summ["n_samples"] == 8 and summ["protocol"]["ks"] == [1, 2]
    assert summ["meta"]["source"]["path"].endswith("gsm8k.jsonl") and summ["meta"]["seed"] == 0
    assert summ["meta"]["backend"] == "hf"  # the backend that ran
    assert json.loads((edir / "synthetic@5.json").read_text())["step"] == 5
    assert [c[2] for c in study.backend.calls] == [cell.config.seed] * 3  # the cell's seed samples
    client = mlflow.MlflowClient(f"sqlite:///{study.results}/mlflow.db")
    run = json.loads((study.results / "evs" / cell.id / "summary.json").read_text())["mlflow_run_id"]
    hist = client.get_metric_history(run, "eval/synthetic/pass_at_1")
    assert [(m.step, m.value) for m in hist] == [(5, 0.5), (10, 0.5)]     # snapshot, then final at steps
    metrics = client.get_run(run).data.metrics
    assert {"eval/gsm8k/avg_at_2", "eval/gsm8k/pass_at_2", "eval/gsm8k/pass_at_2_ci_low"} <= set(metrics)
    assert not any("@" in k for k in metrics)


def test_base_pseudo_cell_shares_one_run_across_jobs(study):
    import mlflow

    from lorarl.evaluate.main import evaluate_cell

    base = base_cells(study.study)[0]
    evaluate_cell("evs", base, study.results, is_base=True, targets=["synthetic"])
    evaluate_cell("evs", base, study.results, is_base=True, targets=["gsm8k"])
    with pytest.raises(plan.EvalPlanError):
        evaluate_cell("evs", base, study.results, is_base=True, targets=["synthetic@5"])
    client = mlflow.MlflowClient(f"sqlite:///{study.results}/mlflow.db")
    exp = client.get_experiment_by_name("evs")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("lorarl.base") == "true"]
    assert len(runs) == 1
    assert {"eval/synthetic/pass_at_1", "eval/gsm8k/avg_at_2"} <= set(runs[0].data.metrics)
    tags, params = runs[0].data.tags, runs[0].data.params
    assert tags["lorarl.base_label"] == base_label(base.config.model, {k: v for k, v in base.axes.items() if k != "model"})
    assert params["model"] == base.config.model and "prompt.template" in params  # how the base was asked
    assert client.get_metric_history(runs[0].info.run_id, "eval/synthetic/pass_at_1")[0].step == 0


def test_missing_snapshot_is_a_clear_error(study):
    import shutil

    from lorarl.evaluate.main import evaluate_cell

    cell = study_cells(study.study)[1]
    shutil.rmtree(study.results / "evs" / cell.id / "snapshots")
    with pytest.raises(FileNotFoundError, match="snapshot of step 5 missing"):
        evaluate_cell("evs", cell, study.results, targets=["synthetic@5"])


def test_full_model_snapshot_is_loaded_as_a_model(study):
    from lorarl.evaluate.main import weights_for

    cell = study_cells(study.study)[0]
    d = study.results / "evs" / cell.id / "snapshots" / "step-5"
    assert weights_for(cell.config, study.results, "evs", cell.id, False, 5) == ("/nonexistent/tiny", d)
    (d / "adapter_config.json").unlink()
    (d / "config.json").write_text("{}")
    assert weights_for(cell.config, study.results, "evs", cell.id, False, 5) == (str(d), None)
    assert weights_for(cell.config, study.results, "evs", "base", True, None) == ("/nonexistent/tiny", None)


def test_aggregate_benchmark_columns_base_rows_and_curve(study):
    from lorarl.report.aggregate import aggregate
    from lorarl.evaluate.main import evaluate_cell

    for cell in study_cells(study.study):
        evaluate_cell("evs", cell, study.results)
    evaluate_cell("evs", base_cells(study.study)[0], study.results, is_base=True)
    # make the two seeds of rank 1 differ on gsm8k so the sd is not zero
    p = study.results / "evs" / "r1-s1" / "eval" / "gsm8k.json"
    s = json.loads(p.read_text())
    s["metrics"]["avg@2"]["value"] = 0.25
    p.write_text(json.dumps(s))
    out = aggregate(study.study, study.results)
    table = pd.read_csv(out["table_csv"])
    for col in ("synthetic/pass@1", "gsm8k/avg@2", "gsm8k/pass@1", "gsm8k/pass@2"):
        assert f"{col}_mean" in table and f"{col}_sd" in table
    r1 = table[table["rank"] == 1].iloc[0]
    assert r1["gsm8k/avg@2_mean"] == pytest.approx((0.5 + 0.25) / 2)
    assert r1["gsm8k/avg@2_sd"] == pytest.approx(pd.Series([0.5, 0.25]).std())
    assert r1["n_seeds"] == 2
    cells = pd.read_csv(out["cells_csv"])
    assert {"synthetic/pass@1_ci_low", "gsm8k/n_problems"} <= set(cells.columns)
    md = out["table_md"].read_text()
    assert "| rank | final train reward | synthetic pass@1 | gsm8k avg@2 | gsm8k pass@1 | gsm8k pass@2 |" in md
    assert "| base (/nonexistent/tiny) | – | 0.500 |" in md
    curve = pd.read_csv(out["eval_curves_csv"])
    assert sorted(set(curve["step"])) == [5, 10] and set(curve["benchmark"]) == {"synthetic"}
    assert len(curve) == 4 * 2
    drawn = pd.read_csv(out["eval_curve_synthetic"].with_suffix(".csv"))
    assert list(drawn["series"]) == ["rank=1", "rank=1", "rank=2", "rank=2", "base model"]
    assert out["eval_curve_synthetic"].stat().st_size > 1000
    assert out["pass1_vs_rank_gsm8k"].exists() and out["pass1_vs_rank_synthetic"].exists()
    assert (out["table_csv"].parent / "base.csv").exists()


# ----------------------------------------------------------------------------- snapshots
def test_snapshot_saver_saves_at_planned_steps_atomically(tmp_path):
    from lorarl.train.snapshots import SnapshotSaver

    saved_models = []

    def save(path, model):
        path.mkdir(parents=True, exist_ok=True)
        (path / ("adapter_config.json" if model == "peft" else "config.json")).write_text(model)
        saved_models.append(model)

    class Tok:
        def save_pretrained(self, path):
            (path / "tokenizer.json").write_text("{}")

    cfg = cell_cfg({"eval_every": 4})
    cb = SnapshotSaver(tmp_path / "snapshots", plan.snapshot_steps(cfg), save, Tok())
    for step in range(1, 11):
        cb.on_step_end(None, SimpleNamespace(global_step=step, is_world_process_zero=True), None, model="peft")
    assert cb.saved == [4, 8] and sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["step-4", "step-8"]
    assert not (tmp_path / "snapshots" / "step-4" / "tokenizer.json").exists()
    cb.on_step_end(None, SimpleNamespace(global_step=4, is_world_process_zero=True), None, model="full")
    d = tmp_path / "snapshots" / "step-4"                    # a rerun replaces the snapshot
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "tokenizer.json"]
    cb.on_step_end(None, SimpleNamespace(global_step=8, is_world_process_zero=False), None, model="peft")
    assert saved_models == ["peft", "peft", "full"]


def test_eval_config_defaults_keep_old_studies_valid():
    e = EvalConfig.model_validate({"max_new_tokens": 40})
    assert e.benchmarks is None and e.eval_every == 0 and e.backend == "hf"
