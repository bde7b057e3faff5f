"""lorarl.report.cost: the jobs' ledger records rolled up per cell, setting and study (tables/cost.csv), the report's
cost section, `lorarl status`'s line, MLflow's cost/* and the price setting's validation."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lorarl.report import cost
from lorarl.language.study import load_study, study_cells
from tests.support.cost import make_record, put
from tests.support.study import tiny_study

SPEC = tiny_study("cst", task=None, adapter=None, eval=None, train={"steps": 10},
                  axes={"rank": {"field": "adapter.rank", "prefix": "r", "values": [1, 4]},
                        "seed": {"field": "seed", "prefix": "s", "values": [0, 1]}})


def gpu_study(tmp: Path) -> tuple:
    """4 cells: r1-s0 trained alone (1 GPU, 5 steps so far), r4-s0 + r4-s1 in one pack (2 GPUs, tokens 3:1),
    r1-s1 not started; an evaluation of r1-s0, the base build and the aggregate (CPU only)."""
    sp = tmp / "cst.yaml"
    sp.write_text(yaml.safe_dump(SPEC))
    st, res = load_study(sp), tmp / "results"
    put(res, "cst", "r1-s0", make_record("train", "r1-s0", wall=3600, gpus=1, study="cst", steps=5,
                                         phases={"startup": 360, "generation": 1800, "update": 900,
                                                 "evaluation": 180}))  # idle 360; a snapshot evaluated in the job
    put(res, "cst", "r1-s0", make_record("evaluate", "r1-s0", key="evaluate-synthetic", wall=720, gpus=1, study="cst",
                                         phases={"startup": 60, "load": 60, "generation": 480, "reward": 120}))
    put(res, "cst", ".packs/p1", make_record("pack", "r4-s0,r4-s1", wall=3600, gpus=2, study="cst",
                                             members={"r4-s0": 300.0, "r4-s1": 100.0},
                                             phases={"startup": 600, "generation": 2400, "update": 600}))
    put(res, "cst", "models/tiny-test", make_record("base", "tiny-test", wall=1800, cpus=4, study=None,
                                                    phases={"startup": 60, "update": 1740}))
    put(res, "cst", ".aggregate", make_record("aggregate", "aggregate", wall=36, cpus=1, study="cst",
                                              phases={"other": 36}, cpu_s=18))
    for cid, steps in (("r1-s0", 5), ("r4-s0", 10), ("r4-s1", 10)):
        c = next(c for c in study_cells(st) if c.id == cid)
        d = res / "cst" / cid
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").write_text(json.dumps({"config_hash": c.hash if steps == 10 else "older", "steps": steps,
                                                    "mlflow_run_id": None}))
        if steps < 10:  # at a rung: its mark says where it stands
            (d / "rungs").mkdir()
            (d / "rungs" / f"step-{steps}.json").write_text("{}")
    return st, res


def test_cost_table_per_cell_setting_and_study_with_packs_split_by_tokens(tmp_path):
    st, res = gpu_study(tmp_path)
    out, df = cost.write(st, res, price=2.0)
    assert out == res / "cst" / "tables" / "cost.csv" and len(pd.read_csv(out)) == len(df)
    rows = df.set_index(["level", "name"])
    assert rows.loc[("cell", "r1-s0"), "gpu_h"] == pytest.approx(1.2)  # 1 h train + 0.2 h evaluation on 1 GPU
    assert rows.loc[("cell", "r4-s0"), "gpu_h"] == pytest.approx(1.5)  # 3/4 of the pack's 2 GPU-hours
    assert rows.loc[("cell", "r4-s1"), "gpu_h"] == pytest.approx(0.5)
    assert rows.loc[("cell", "r4-s0"), "phase/generation_h"] == pytest.approx(2 * 2400 / 3600 * 0.75)
    # the base build and the aggregate: CPU only, 0 GPU-hours, their core-hours kept
    assert rows.loc[("cell", "base:tiny-test"), "gpu_h"] == 0 and rows.loc[("cell", "base:tiny-test"),
                                                                          "cpu_core_h"] == pytest.approx(2.0)
    agg = rows.loc[("cell", "aggregate")]
    assert agg["cpu_core_h"] == pytest.approx(0.01) and agg["cpu_idle_share"] == pytest.approx(0.5)
    setting = rows.loc[("setting", "rank=4")]
    assert setting["gpu_h"] == pytest.approx(2.0) and setting["stage/pack_h"] == pytest.approx(2.0)
    assert rows.loc[("setting", "rank=1"), "stage/evaluate_h"] == pytest.approx(0.2)
    study = rows.loc[("study", "cst")]
    assert study["unit"] == "gpu" and study["gpu_h"] == pytest.approx(3.2) and study["cost"] == pytest.approx(6.4)
    assert study["idle_share"] == pytest.approx(360 / (3.2 * 3600))  # only the solo train job left time untimed
    assert sum(study[f"phase/{p}_h"] for p in [*cost.PHASES, "idle"]) == pytest.approx(study["device_h"])
    # the evaluation's share: the evaluate job (load, generation, grading) and the train job's snapshot evaluation
    assert rows.loc[("cell", "r1-s0"), "eval_h"] == pytest.approx(0.25)
    assert rows.loc[("cell", "r1-s0"), "eval_share"] == pytest.approx(0.25 / 1.2)
    assert rows.loc[("cell", "r1-s0"), "phase/load_h"] == pytest.approx(60 / 3600)
    assert rows.loc[("setting", "rank=4"), "eval_share"] == 0 and study["eval_share"] == pytest.approx(0.25 / 3.2)
    assert "eval_share" in pd.read_csv(out).columns and cost.metrics(study)["cost/eval_share"] == study["eval_share"]
    assert "evaluation share 7.8%" in cost.html_section(df, {}, 2.0)


def test_progress_projects_the_rest_from_the_finished_steps(tmp_path, capsys):
    st, res = gpu_study(tmp_path)
    p = cost.progress(st, res)
    assert p["steps_done"] == 25 and p["steps_left"] == 15  # r1-s0 at 5 of 10, r1-s1 not started
    assert p["per_step_h"] == pytest.approx(3.0 / 25)  # train + pack GPU-hours per finished step
    assert p["projected_h"] == pytest.approx(3.2 + 15 * 3.0 / 25) and "full_grid_h" not in p
    line = cost.progress_line(p)
    assert line.startswith("cost: 3.2 GPU-h spent") and "projected 5 GPU-h at the end" in line
    from lorarl.cli import main

    assert cost.status_line(st, res) == line
    assert main(["status", str(tmp_path / "cst.yaml"), "--results", str(res)]) == 0
    assert line in capsys.readouterr().out.splitlines()  # `lorarl status` prints it under the table
    assert cost.progress_line({}).startswith("cost: no job record yet")


def test_adaptive_progress_against_the_full_grid_and_per_decided_hypothesis(tmp_path):
    spec = {**SPEC, "name": "cst", "hypotheses": {"h1": {"kind": "superiority", "a": {"rank": 4}, "b": {"rank": 1},
                                                          "margin": 0.0, "min_seeds": 2, "max_seeds": 2}}}
    st, res = gpu_study(tmp_path)
    sp = tmp_path / "cst.yaml"
    sp.write_text(yaml.safe_dump(spec))
    st = load_study(sp)
    led = res / "cst" / "adaptive" / "hypotheses.json"
    led.parent.mkdir(parents=True)
    led.write_text(json.dumps({"hypotheses": {"h1": {"decision": "supported"}}}))
    p = cost.progress(st, res)
    assert p["full_grid_h"] == pytest.approx(0.2 + 40 * 3.0 / 25)  # every cell to its end, at the measured rate
    assert p["hypotheses_decided"] == 1 and p["per_decided_h"] == pytest.approx(3.2)
    assert "1 hypotheses decided, 3.2 GPU-h each" in cost.progress_line(p)


def test_a_cpu_study_counts_core_hours_and_zero_gpu_hours(tmp_path):
    sp = tmp_path / "cst.yaml"
    sp.write_text(yaml.safe_dump(SPEC))
    st, res = load_study(sp), tmp_path / "results"
    put(res, "cst", "r1-s0", make_record("train", "r1-s0", wall=1800, cpus=2, study="cst", cpu_s=1800,
                                         phases={"startup": 100, "update": 1700}))
    df = cost.cost_table(st, res)
    s = df[df["level"] == "study"].iloc[0]
    assert s["unit"] == "cpu" and s["gpu_h"] == 0 and s["cpu_core_h"] == pytest.approx(1.0)
    assert s["device_h"] == pytest.approx(1.0) and s["cpu_idle_share"] == pytest.approx(0.5)
    html = cost.html_section(df, cost.progress(st, res), None)
    assert "1 CPU core-hours" in html and "no price per GPU-hour configured (hours only)" in html
    assert "CPU core-hours by phase" in html and "CPU core-hours by stage" in html
    assert cost.metrics(s)["cost/cpu_core_h"] == pytest.approx(1.0)


def test_cost_metrics_go_to_each_cell_run_and_the_study_parent(tmp_path):
    class Client:
        def __init__(self):
            self.logged: dict[str, dict] = {}

        def get_run(self, run_id):
            m = {k: v for k, v in self.logged.get(run_id, {}).items()}
            return type("R", (), {"data": type("D", (), {"metrics": m})()})()

        def log_batch(self, run_id, metrics):
            self.logged.setdefault(run_id, {}).update({m.key: m.value for m in metrics})

    class Tracker:
        client = Client()

        def retry(self, what, fn):
            return fn()

    st, res = gpu_study(tmp_path)
    (res / "cst" / "r4-s0" / "summary.json").write_text(json.dumps({"mlflow_run_id": "run-r4s0"}))
    t = Tracker()
    df = cost.cost_table(st, res)
    assert cost.log_mlflow(t, "parent", st, res, df) == 2
    assert t.client.logged["parent"]["cost/gpu_h"] == pytest.approx(3.2)
    assert t.client.logged["run-r4s0"]["cost/gpu_h"] == pytest.approx(1.5)
    assert t.client.logged["run-r4s0"]["cost/stage/pack_h"] == pytest.approx(1.5)
    assert cost.log_mlflow(t, "parent", st, res, df) == 0  # unchanged values are not logged again


def test_a_bad_price_is_refused_naming_the_field_before_anything_is_written(tmp_path, capsys):
    from lorarl.cli import main

    sp = tmp_path / "cst.yaml"
    sp.write_text(yaml.safe_dump(SPEC))
    for bad in ("cheap", "-1"):
        with pytest.raises(SystemExit) as exit_:
            main(["aggregate", str(sp), "--results", str(tmp_path / "r"), "--gpu-hour-price", bad])
        assert exit_.value.code == 2
        assert f"gpu_hour_price: '{bad}' is not allowed; allowed: a number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert cost.parse_price("") is None and cost.parse_price("2.5") == 2.5


def test_scheduler_tail_is_sacct_elapsed_less_the_jobs_own_wall_time():
    """The allocation after a Slurm job's process ended (its step and job end) is charged as `scheduler`; a requeued
    job (sacct: its last run only), a job sacct cannot say, and a local job are left as they are; never negative."""
    recs = [{"job_id": "11", "started_by": "slurm", "restart_count": 0, "wall_s": 100.0, "phases_s": {"update": 90.0}},
            {"job_id": "12", "started_by": "slurm", "restart_count": 1, "wall_s": 50.0, "phases_s": {}},
            {"job_id": "13", "started_by": "slurm", "restart_count": 0, "wall_s": 40.0, "phases_s": {}},
            {"job_id": "14", "started_by": "slurm", "restart_count": 0, "wall_s": 30.0, "phases_s": {}},
            {"job_id": None, "started_by": "process", "restart_count": 0, "wall_s": 20.0, "phases_s": {}}]
    got = cost.scheduler_tails(recs, elapsed={"11": 112, "12": 80, "14": 29})
    assert got[0]["phases_s"] == {"update": 90.0, "scheduler": 12.0} and got[0]["wall_s"] == 112.0
    assert [r["wall_s"] for r in got[1:]] == [50.0, 40.0, 30.0, 20.0]
    assert all("scheduler" not in r["phases_s"] for r in got[1:])
