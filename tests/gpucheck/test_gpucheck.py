"""`python -m lorarl.gpucheck`: the twins keep the published studies' shapes, a CPU without --cpu-smoke fails
with a report saying why, and --cpu-smoke runs every check's code path for real (slow)."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from lorarl.gpucheck.checks import multilora_row, push_row, vllm_importable
from lorarl.gpucheck.main import DOCTOR_ROWS
from lorarl.gpucheck.shapes import ARCHS, twins
from lorarl.language.study import load_study, study_cells
from tests.support.gpucheck import ROOT, _run


@pytest.mark.parametrize("mode", ["full", "quick", "large"])
def test_twins_keep_the_published_studies_shapes(mode):
    for twin in twins(mode):
        study = load_study(ROOT / "experiments" / f"{twin.study}.yaml")
        a = twin.cell["adapter"]
        cfg = next(c.config for c in study_cells(study) if c.config.adapter.method == "lora"
                   and c.config.adapter.init == a.get("init", "kaiming") and c.config.adapter.rank == a["rank"])
        t = twin.cell["train"]
        assert (t["prompts_per_step"], t["generations"]) == (cfg.train.prompts_per_step, cfg.train.generations)
        assert t["max_completion_length"] == cfg.train.max_completion_length >= twin.completion
        assert (t["beta"], t["loss_type"]) == (cfg.train.beta, cfg.train.loss_type)
        assert (a["rank"], a["alpha"], a.get("dropout", 0.0)) == (cfg.adapter.rank, cfg.adapter.alpha, cfg.adapter.dropout)
    a = ARCHS["qwen3-1.7b"]  # Qwen3-1.7B-Base's config.json, the reward_density student
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab) == (2048, 28, 16, 8, 6144, 151936)
    a = ARCHS["qwen2.5-1.5b"]  # DeepSeek-R1-Distill-Qwen-1.5B's, the peft_zoo base
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab) == (1536, 28, 12, 2, 8960, 151936)


@pytest.mark.parametrize("mode", ["full", "quick", "large", "cpu-smoke"])
def test_every_twin_study_is_a_valid_study_on_either_engine(mode, tmp_path, monkeypatch):
    """The studies gpucheck writes load as a user's would (the vLLM twin once had processed logprobs with
    top_p 0.95, which lorarl refuses, so its doctor exited 2 wherever vLLM ran); a top_p < 1 twin samples the
    whole distribution on vLLM."""
    import yaml

    from lorarl.gpucheck.shapes import twin_study

    monkeypatch.setenv("LORARL_SKIP_PATH_CHECKS", "1")
    for twin in twins(mode):
        for engine, eager in (("hf", False), ("vllm", False), ("vllm", True)):
            doc = twin_study(twin, str(tmp_path / "model"), steps=2, seeds=1, eval_limit=2, engine=engine, eager=eager)
            path = tmp_path / f"{doc['name']}.yaml"
            path.write_text(yaml.safe_dump(doc))
            cfg = study_cells(load_study(path))[0].config
            assert (cfg.rollout.engine, cfg.eval.backend) == ((engine, engine) if engine == "vllm" else ("hf", "hf"))
            assert cfg.rollout.enforce_eager is eager  # vLLM's CPU build: eager (no inductor compile)
            want = twin.cell["train"].get("top_p", 1.0) if engine == "hf" else 1.0
            assert cfg.train.top_p == want


@pytest.mark.parametrize("stale", [False, True])
def test_vllm_push_check_sees_whether_the_engine_samples_the_pushed_lora(tmp_path, stale, monkeypatch):
    """The push job's work against tests/support/fake_vllm.py (vLLM's load_weights path): a live engine samples the
    merged trained LoRA (gap at bf16 noise), an engine that drops pushes shows the LoRA's effect and fails."""
    from lorarl.gpucheck.shapes import build_model
    from lorarl.gpucheck.vllmjob import push_check
    from tests.support import fake_vllm

    build_model("tiny-qwen3", tmp_path / "m", "cpu")
    monkeypatch.setattr(fake_vllm.LLM, "stale_default", stale)
    monkeypatch.setattr(fake_vllm.LLM, "instances", [])  # a fresh process as far as the fake knows (one engine)
    got = push_check(fake_vllm.api(), str(tmp_path / "m"), rank=1, alpha=32)
    assert got["push_s"] > 0 and got["tokens"] == 64 and got["pushed_params"] > 300_000
    r = push_row(got)
    assert r["status"] == ("fail" if stale else "pass"), r
    assert (got["gap"] > 0.05) if stale else (got["gap"] < 0.01)


@pytest.mark.parametrize("applied", [True, False])
def test_multilora_check_sees_whether_each_member_samples_its_own_adapter(tmp_path, applied, monkeypatch):
    """The pack's vLLM sampling path against the fake: 4 adapters, one engine, one call, same seed streams;
    an engine that samples the base for every request (adapters not applied) fails the check."""
    from lorarl.gpucheck.shapes import build_model
    from lorarl.gpucheck.vllmjob import multilora_check
    from tests.support import fake_vllm

    build_model("tiny-qwen3", tmp_path / "m", "cpu")
    monkeypatch.setattr(fake_vllm.LLM, "apply_adapters", applied)
    monkeypatch.setattr(fake_vllm.LLM, "instances", [])  # a fresh process as far as the fake knows (one engine)
    got = multilora_check(fake_vllm.api(), str(tmp_path / "m"), rank=1, alpha=32, work=str(tmp_path / "w"),
                          tokens=8)
    assert got["rows_per_member"] == [8] * 4 and got["tokens"] > 0
    r = multilora_row(got)
    assert r["status"] == ("pass" if applied else "fail") and got["distinct_members"] == (4 if applied else 1), r


def test_real_shapes_on_a_cpu_fail_with_why_and_no_figure(tmp_path):
    proc = _run(out=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "gpucheck.json").read_text())
    assert not res["ok"] and res["environment"]["device"]["kind"] == "cpu"
    assert [(r["check"], r["status"]) for r in res["checks"]] == [("device", "fail")]
    assert "on a CPU use --cpu-smoke" in res["checks"][0]["why"]
    assert "FAILED" in (tmp_path / "gpucheck.md").read_text() and not (tmp_path / "work").exists()


def test_bad_input_exits_2(tmp_path):
    proc = _run("--threads", "0", out=tmp_path, timeout=120)
    assert proc.returncode == 2 and "--threads must be >= 1" in proc.stderr
    assert not (tmp_path / "gpucheck.json").exists()


def test_vllm_only_without_vllm_fails_saying_why(tmp_path):
    if vllm_importable() is None:
        pytest.skip("vllm importable here: tests/vllm_real/test_gpucheck_real.py runs --vllm-only for real")
    proc = _run("--cpu-smoke", "--vllm-only", out=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "gpucheck.json").read_text())
    assert [(r["check"], r["status"]) for r in res["checks"]] == [("device", "pass"), ("vllm import", "fail")]
    assert res["checks"][1]["why"].startswith("--vllm-only: vllm not importable")
    assert "--cpu-smoke --vllm-only`" in (tmp_path / "gpucheck.md").read_text() and not (tmp_path / "work").exists()


def test_a_budget_lists_every_row_skipped_with_its_need_and_ends_within_it(tmp_path):
    """--minutes: the budget runs from the process's start; a check starts only when its need fits, the rest read
    'skipped (needs ~N s, M s left)' (not a failure), every row is listed, and the run ends within the budget."""
    t0 = time.perf_counter()
    proc = _run("--cpu-smoke", "--minutes", "0.25", out=tmp_path, timeout=600)
    took = time.perf_counter() - t0
    res = json.loads((tmp_path / "gpucheck.json").read_text())
    assert proc.returncode == 0 and res["ok"] and res["minutes"] == 0.25, proc.stdout + proc.stderr
    rows = {r["check"]: r for r in res["checks"]}
    assert rows["job start-up"]["status"] in ("pass", "cut") and rows["job start-up"]["data"]["start_s"] > 0
    for study in ("reward_density", "peft_zoo"):
        for name in [f"{c}: {study}" for c in DOCTOR_ROWS] + (["packed K=4 vs 4 solo", "distributed launcher, 1 GPU"]
                                                                if study == "reward_density" else []):
            assert rows[name]["status"] == "not run", rows[name]
            assert re.fullmatch(r"skipped \(needs ~\d+ s, \d+ s left of 0.25 min\)", rows[name]["why"]), rows[name]
    assert all(r["status"] in ("pass", "cut") or r["why"].startswith(("skipped (needs ~", "vllm not importable",
                                                                      "cpu-smoke: a GPU's check"))
               for r in res["checks"])
    assert "--cpu-smoke --minutes 0.25`" in (tmp_path / "gpucheck.md").read_text()
    assert not (tmp_path / "work" / "results").exists()  # nothing started past the budget
    assert res["wall_s"] <= 15 + 1 and took <= 15 + 10, (res["wall_s"], took)


def test_a_check_starts_when_its_need_fits_and_is_cut_at_its_bound():
    """The gate (lorarl.gpucheck.main.gated): a check that took twice its estimate doubles the next need; a need
    past what is left is skipped with the need, its work never started; a started check still running at its
    bound is killed there, its rows read 'cut' (also the ones it did not reach); all within the budget."""
    from lorarl.gpucheck import budget as bd
    from lorarl.gpucheck import checks as ck
    from lorarl.gpucheck.main import gated

    ten = bd.Budget(minutes=10, t0=time.perf_counter())  # a bound: 3x the need, 2 minutes more at least, within it
    assert ten.bound(10.0) == pytest.approx(130.0) and ten.bound(100.0) == pytest.approx(300.0)
    assert ten.bound(1000.0) == pytest.approx(600 - bd.RESERVE_S, abs=0.5) and bd.Budget(None, 0.0).bound(5.0) is None
    clock = bd.Budget(minutes=0.15, t0=time.perf_counter())  # 9 s, RESERVE_S of them kept for the report
    rows: list = []

    def slow() -> list:
        time.sleep(1.0)
        return [ck.row("slow", "pass", "slept 1 s")]

    gated(rows, clock, ["slow"], 0.5, slow)
    assert rows[0]["status"] == "pass" and rows[0]["data"]["estimate_s"] == 0.5 and rows[0]["data"]["wall_s"] >= 1.0
    assert 2.0 <= clock.factor() < 3.0 and clock.need(1.0) == pytest.approx(clock.factor())
    started = []
    gated(rows, clock, ["big", "big too"], 10.0, lambda: started.append(1) or [])
    assert not started and [r["status"] for r in rows[1:]] == ["not run", "not run"]
    assert re.fullmatch(r"skipped \(needs ~(\d+) s, \d+ s left of 0.15 min\)", rows[1]["why"])
    assert int(rows[1]["why"].split("~")[1].split()[0]) == round(10.0 * clock.ratios[0])

    def endless() -> list:
        proc = ck.sub([sys.executable, "-c", "import time; time.sleep(120)"])
        return [ck.row("endless", "pass" if proc.returncode == 0 else "fail", f"exit {proc.returncode}")]

    gated(rows, clock, ["endless", "endless's second row"], 0.5, endless)
    cut = rows[3:]
    assert [(r["check"], r["status"]) for r in cut] == [("endless", "cut"), ("endless's second row", "cut")]
    assert cut[0]["figure"] == "exit -9" and cut[0]["why"].startswith("cut at its bound (")
    assert time.perf_counter() - clock.t0 <= 0.15 * 60 - bd.RESERVE_S + 1.0 and not ck.DEADLINE


def test_doctor_estimate_counts_warm_up_evaluation_and_diagnostics():
    """The doctor's need (lorarl.gpucheck.budget.doctor_estimate) grows by each part it counts; with the third H200
    run's calibration (bench/results/gpucheck-h200.md: start-up 25 s, 63.4 ms per decoded token for 16 rows,
    135.75 us per trained token, 512 tokens, 3 steps) it is above the 399 s its doctor ran before it was killed."""
    from lorarl.gpucheck import budget as bd

    speed = bd.Speed(0.0634, 135.75e-6, 0.0, svd_s=0.5)
    base = bd.doctor_estimate(25.0, speed, 16, 512, 3, 4)
    assert base >= 399
    assert bd.doctor_estimate(25.0, speed, 16, 512, 3, 4, layers=28) == pytest.approx(
        base + 28 * bd.ADAPTED_PER_LAYER * bd.SVDS_PER_MATRIX * 0.5)
    step = speed.step_s(16, 512) + (bd.GENERATE_SLOWDOWN - 1) * 512 * 0.0634
    assert bd.doctor_estimate(25.0, speed, 16, 512, 4, 4) == pytest.approx(base + step)
    no_decode = bd.Speed(0.0, 135.75e-6, 0.0)
    assert bd.doctor_estimate(25.0, no_decode, 16, 512, 3, 4) == pytest.approx(75 + 4 * no_decode.step_s(16, 512))


def test_bad_minutes_exit_2(tmp_path):
    proc = _run("--minutes", "0", out=tmp_path, timeout=120)
    assert proc.returncode == 2 and "--minutes must be > 0" in proc.stderr




def test_batch_invariant_job_holds_each_member_of_a_mixed_rank_pack_to_its_run_alone(tiny_dir, tmp_path, monkeypatch,
                                                                                    capsys):
    """The GPU check's job (lorarl.gpucheck.invariantjob) on the tests' tiny model, one step, two ranks: per mode each member's
    tokens and adapter against its run alone, the phases' seconds and the base's probe; on this CPU every member
    equals its run alone with the mode on (a pass); a member that differs fails the row, naming the probe's module."""
    import yaml

    from lorarl.gpucheck import invariantjob
    from lorarl.gpucheck.checks import invariant_row
    from lorarl.gpucheck.shapes import twin_study

    twin = next(t for t in twins("cpu-smoke") if t.study == "reward_density")
    study = tmp_path / "study.yaml"
    doc = twin_study(twin, str(tiny_dir), steps=1, seeds=4, eval_limit=2, completion=4)
    doc["defaults"]["reward"] = {"regime": "outcome", "answer_format": "last_number"}  # no math-verify workers
    doc["defaults"]["train"]["precision"] = "fp32"
    study.write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(invariantjob, "RANKS", (1, 32))  # two members of mixed ranks: CI's time (the GPU's: four)
    monkeypatch.setattr(sys, "argv", ["invariantjob", str(study), str(tmp_path / "res")])
    invariantjob.main()
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for mode in ("off", "on"):
        members = got[mode]["members"]
        assert sorted(m["rank"] for m in members.values()) == [1, 32]
        assert got[mode]["packed_s"]["generation"] > 0 and got[mode]["alone_s"]["update"] > 0
        seeds = got[mode]["seeds"]  # packed - alone mean loss per member's seed, and their interval
        assert seeds["metric"] == "loss" and len(seeds["d"]) == 2 and max(map(abs, seeds["d"])) <= 1e-6
    assert all(m["tokens_equal"] and m["adapter_diff"] <= 1e-6 for m in got["on"]["members"].values())
    r = invariant_row(got)
    assert r["status"] == "pass" and "on: 2/2 members sample their solo tokens" in r["figure"], r
    assert "packed - alone loss over 2 seeds" in r["figure"]
    name = next(iter(got["on"]["members"]))
    got["on"]["members"][name].update(tokens_equal=False, first_differing_step=1)
    got["probe_on"] = {"first_module": "model.layers.0.mlp.down_proj", "module": "Linear", "max_diff": 2e-3}
    r = invariant_row(got)
    assert r["status"] == "fail" and "on: 1/2" in r["figure"] and "on model.layers.0.mlp.down_proj (Linear" in r["figure"]
