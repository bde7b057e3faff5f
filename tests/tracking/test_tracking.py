"""lorarl.tracking.client on the sqlite default: settings, credentials, retries, a lost reply, a lock held too
long, sync-mlflow, and (slow) 8 concurrent writer processes. The server: tests/tracking/test_tracking_server.py."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from lorarl import cli
from lorarl.tracking import client as tracking, server as tracking_server
from lorarl.tracking import credentials as tracking_credentials
from lorarl.tracking.client import Tracker, TrackingError, TrackingUnavailable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.tracking import METRICS, count_rows, run_writers  # noqa: E402


def _history(t: Tracker, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in t.client.get_metric_history(t.run_id, key))


def test_tracking_setting_values(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_tracking(None, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert tracking.resolve_tracking("http://127.0.0.1:5000/", tmp_path) == "http://127.0.0.1:5000"
    with pytest.raises(TrackingError, match=r"tracking: 'postgres' is not allowed; allowed: 'sqlite'"):
        tracking.resolve_tracking("postgres", tmp_path)


def test_bad_tracking_in_launch_exits_2_before_anything_is_written(tmp_path: Path, capsys, monkeypatch):
    for k in (tracking.TRACKING_ENV, tracking_credentials.CREDENTIALS_ENV, "MLFLOW_TRACKING_USERNAME"):
        monkeypatch.setenv(k, "")  # recorded, so that whatever the command sets is undone afterwards
        monkeypatch.delenv(k)
    code = cli.main(["launch", "train", str(tmp_path / "study.yaml"), "c", "--results", str(tmp_path / "res"),
                     "--tracking", "ftp://somewhere"])
    assert code == 2
    err = capsys.readouterr().err
    assert "tracking: 'ftp://somewhere' is not allowed" in err and "http(s)://host:port" in err
    assert not (tmp_path / "res").exists()
    creds = tmp_path / "creds"
    creds.write_text("username = u\npassword = p\n")
    os.chmod(creds, 0o644)  # readable by others: refused before anything is submitted
    code = cli.main(["launch", "train", str(tmp_path / "study.yaml"), "c", "--results", str(tmp_path / "res"),
                     "--tracking", "http://127.0.0.1:5000", f"--tracking-credentials={creds}"])
    assert code == 2 and "chmod 600" in capsys.readouterr().err and not (tmp_path / "res").exists()


def test_credentials_file_must_be_private(tmp_path: Path, monkeypatch):
    from mlflow.tracking._tracking_service import utils as store_utils

    registry = store_utils._tracking_store_registry
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))  # configure_client's builders undone
    for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(k, "")  # recorded, so that configure_client's settings are undone afterwards
        monkeypatch.delenv(k)
    f = tmp_path / "creds"
    monkeypatch.setenv(tracking_credentials.CREDENTIALS_ENV, str(f))
    # beyond loopback without a credentials file: refused, naming the file
    with pytest.raises(TrackingError, match="needs the credentials file"):
        tracking_credentials.configure_client("http://10.1.2.3:5000")
    creds = tracking_credentials.write_credentials(f)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and len(creds["password"]) >= 20
    os.chmod(f, 0o644)
    with pytest.raises(TrackingError, match="chmod 600"):
        tracking_credentials.load_credentials(f)
    os.chmod(f, 0o600)
    tracking_credentials.configure_client("http://10.1.2.3:5000")
    # the credentials reach MLflow's client of that server only, never the environment (children, `ps e`)
    assert "MLFLOW_TRACKING_USERNAME" not in os.environ and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    host = store_utils._get_store("http://10.1.2.3:5000").get_host_creds()
    assert (host.username, host.password) == ("lorarl", creds["password"])
    other = store_utils._get_store("http://10.9.9.9:5000").get_host_creds()
    assert other.username is None and other.password is None
    assert tracking_credentials.write_credentials(f) == creds  # never overwritten
    assert tracking_credentials.is_loopback("127.0.0.1") and tracking_credentials.is_loopback("::1")
    assert not tracking_credentials.is_loopback("0.0.0.0") and not tracking_credentials.is_loopback("node01")


def test_lost_reply_is_resent_and_stored_once(tmp_path: Path):
    """The store commits a batch but the reply never arrives: the retry sends the same Metric objects
    (same timestamps) and MLflow's primary key keeps one row per (metric, step)."""
    t = Tracker(tmp_path, "st")
    t.start("c", "c", tags={}, params={})
    real, calls = t.client.log_batch, []

    def commit_then_fail(run_id, metrics=(), **kw):
        calls.append(len(metrics))
        real(run_id, metrics=metrics, **kw)
        if len(calls) == 1:
            raise ConnectionError("connection reset by peer (reply lost)")

    t.client.log_batch = commit_then_fail
    assert t.log_metrics([{"step": s, "reward": s / 10, "loss": float(s)} for s in (1, 2, 3)])
    assert calls == [6, 6]
    assert _history(t, "reward") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert _history(t, "loss") == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_sqlite_lock_held_beyond_timeout(tmp_path: Path, monkeypatch):
    """Metric flushes go pending (training goes on) and catch up exactly once when the lock is free;
    writes that must succeed (a new run, the end of the run) fail clearly, naming the lock and holder."""
    monkeypatch.setenv(tracking.LOCK_ENV, "0.2")
    monkeypatch.setenv(tracking.RETRY_ENV, "1")
    t = Tracker(tmp_path, "st")
    t.start("c", "c", tags={}, params={})
    assert t.log_metrics([{"step": 1, "reward": 0.1}], wait=False)
    holder = open(tmp_path / ".mlflow.lock", "a+")  # another open file description: a foreign holder
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert t.log_metrics([{"step": 2, "reward": 0.2}], wait=False) is False  # the trainer: train on
        assert t.log_metrics([{"step": 3, "reward": 0.3}], wait=False) is False and len(t.pending) == 2
        with pytest.raises(TrackingUnavailable, match="log metrics failed"):  # evaluation: must get through
            t.log_metrics([{"step": 3, "eval/x": 1.0}])
        with pytest.raises(TrackingUnavailable, match=r"\.mlflow\.lock held for more than 0\.2 s"):
            t.finish()
        with pytest.raises(TrackingUnavailable, match="create the run of cell d failed"):
            Tracker.start(t, "d", "d", tags={}, params={})
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
    t.run_id = t.client.search_runs([t.experiment_id], "tags.`lorarl.cell_id` = 'c'")[0].info.run_id
    assert t.log_metrics([{"step": 4, "reward": 0.4}], wait=False)
    t.finish()
    assert _history(t, "reward") == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert _history(t, "eval/x") == [(3, 1.0)]
    assert t.client.get_run(t.run_id).info.status == "FINISHED"


def _synthetic_study(tmp_path: Path) -> tuple[Path, Path]:
    from lorarl.language.study import load_study, study_cells

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "sy", "defaults": {"model": "local:tiny-test"},
                                     "axes": {"seed": {"field": "seed", "prefix": "s", "values": [0, 1]}}}))
    res = tmp_path / "results"
    for cell in study_cells(load_study(study)):
        d = res / "sy" / cell.id
        (d / "eval").mkdir(parents=True)
        (d / "metrics.csv").write_text("step,loss,reward\n1,0.5,0.1\n2,0.4,\n3,0.3,0.3\n")
        (d / "summary.json").write_text(json.dumps({"mlflow_run_id": "not-in-this-store", "final_train_reward": 0.3,
                                                    "wall_time_s": 9.0, "params_trainable": 10,
                                                    "trainable_fraction": 0.1}))
        (d / "eval" / "synthetic.json").write_text(json.dumps({
            "benchmark": "synthetic", "step": None, "truncated_frac": 0.0, "mean_tokens": 5.0,
            "metrics": {"pass@1": {"value": 0.5, "ci_low": 0.2, "ci_high": 0.8}}}))
    return study, res


def test_sync_mlflow_replays_files_into_a_new_or_repaired_store_exactly_once(tmp_path: Path, monkeypatch, capsys):
    from lorarl.language.study import load_study, study_cells

    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    study, res = _synthetic_study(tmp_path)
    last = study_cells(load_study(study))[0].config.train.steps  # the final evaluation sits at the last step
    # s0 ran while the store was reachable for one step only: its run holds loss@1
    t = Tracker(res, "sy")
    s0_run = t.start("s0", "s0", tags={}, params={})
    t.log_metrics([{"step": 1, "loss": 0.5}])
    s0 = res / "sy" / "s0" / "summary.json"
    s0.write_text(json.dumps({**json.loads(s0.read_text()), "mlflow_run_id": s0_run}))
    s1 = res / "sy" / "s1" / "summary.json"
    mtime = s1.stat().st_mtime_ns

    assert cli.main(["sync-mlflow", str(study), "--results", str(res), "--tracking", "sqlite"]) == 0
    out = capsys.readouterr().out
    # 5 from metrics.csv (an empty cell is none) + 4 summary scalars + 5 eval numbers = 14, one there
    assert f"s0: run {s0_run} (found); 13 value(s) logged, 1 already there" in out and "2 cell(s) synced" in out
    s1_run = json.loads(s1.read_text())["mlflow_run_id"]
    assert s1_run != "not-in-this-store" and s1.stat().st_mtime_ns == mtime  # no Snakemake rerun
    for run in (s0_run, s1_run):
        t.run_id = run
        assert _history(t, "loss") == [(1, 0.5), (2, 0.4), (3, 0.3)]
        assert _history(t, "reward") == [(1, 0.1), (3, 0.3)]  # an empty csv cell is no value
        assert _history(t, "eval/synthetic/pass_at_1") == [(last, 0.5)]
        assert _history(t, "final_train_reward") == [(0, 0.3)]
        assert t.client.get_run(run).info.status == "FINISHED"
    # again: nothing is logged twice
    assert cli.main(["sync-mlflow", str(study), "--results", str(res), "--tracking", "sqlite"]) == 0
    assert "0 value(s) logged, 14 already there" in capsys.readouterr().out
    assert len(t.client.search_runs([t.experiment_id], "tags.`lorarl.cell_id` = 's1'")) == 1


def test_sync_mlflow_replays_a_toy_study_exactly_once(tmp_path: Path, monkeypatch, capsys):
    """A kl_bound_toy-shaped study (2 ranks x 1 seed, 2 epochs, one shared Tracker as the toy job): `sync-mlflow` into a new store rebuilds
    each cell's run with the values the toy itself logged (bools as 0/1), keeps summary.json's mtime,
    and logs nothing the second time or into the store that already has them."""
    import mlflow

    from lorarl.language.study import study_cells
    from lorarl.toy.cells import run_toy_study

    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    spec = {"name": "toysync", "kind": "kl_bound_toy", "defaults": {"toy": {"epochs": 2}},
            "axes": {"rank": {"field": "rank", "prefix": "r", "values": [1, 8]},
                     "seed": {"field": "seed", "prefix": "s", "values": [0]}}}
    study_file = tmp_path / "toysync.yaml"
    study_file.write_text(yaml.safe_dump(spec))
    res = tmp_path / "results"
    from lorarl.language.study import load_study

    study = load_study(study_file)
    run_toy_study(study, res)
    ids = [c.id for c in study_cells(study)]
    old = mlflow.MlflowClient(tracking.resolve_tracking("sqlite", res))
    summaries = {c: res / "toysync" / c / "summary.json" for c in ids}
    old_runs = {c: json.loads(f.read_text())["mlflow_run_id"] for c, f in summaries.items()}
    mtimes = {c: f.stat().st_mtime_ns for c, f in summaries.items()}

    new_uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    assert cli.main(["sync-mlflow", str(study_file), "--results", str(res), "--tracking", new_uri]) == 0
    out = capsys.readouterr().out
    assert f"2 cell(s) synced into {new_uri}" in out and out.count("(created)") == 2
    new = mlflow.MlflowClient(new_uri)
    exp = new.get_experiment_by_name("toysync")
    for c in ids:
        new_run = json.loads(summaries[c].read_text())["mlflow_run_id"]
        assert new_run != old_runs[c] and summaries[c].stat().st_mtime_ns == mtimes[c]
        before, after = old.get_run(old_runs[c]), new.get_run(new_run)
        assert after.info.experiment_id == exp.experiment_id and after.info.status == "FINISHED"
        assert after.data.tags["lorarl.cell_id"] == c and after.data.tags["axis.rank"] == c.split("-")[0][1:]
        assert after.data.params["rank"] == before.data.params["rank"]
        assert after.data.metrics == pytest.approx(before.data.metrics)  # every value the toy logged
        assert "bound_holds" in after.data.metrics and "kl" in after.data.metrics
        for key in after.data.metrics:
            assert [m.step for m in new.get_metric_history(new_run, key)] == [0], key  # once
    assert cli.main(["sync-mlflow", str(study_file), "--results", str(res), "--tracking", new_uri]) == 0
    out = capsys.readouterr().out
    assert out.count(" 0 value(s) logged") == 2 and out.count("(found)") == 2
    assert len(new.search_runs([exp.experiment_id], "tags.`lorarl.cell_id` != ''")) == 2


@pytest.mark.slow
def test_eight_concurrent_writers_sqlite(tmp_path: Path, monkeypatch):
    """8 processes write one sqlite store at once through Tracker (flock): no (metric, step) lost or doubled."""
    import mlflow

    env = {k: v for k, v in os.environ.items() if k != tracking.TRACKING_ENV}
    reports = run_writers(8, tmp_path, "conc", steps=12, env={**env, tracking.TRACKING_ENV: "sqlite"})
    assert len(reports) == 8
    client = mlflow.MlflowClient(tracking.resolve_tracking("sqlite", tmp_path))
    rows = count_rows(client, "conc", 8, 12)
    assert rows["runs"] == 8 and rows["finished"] == 8 and set(rows["cells"].values()) == {1}
    # (a flush that waited too long for the lock went pending and was caught up later: still once)
    assert rows["lost"] == 0 and rows["duplicated"] == 0


def test_profiles_name_their_store():
    from lorarl.tracking.server import profile_tracking

    repo = Path(__file__).resolve().parents[2]
    assert profile_tracking(repo / "profiles" / "slurm") == "http://127.0.0.1:5000"  # the server form
    assert profile_tracking(repo / "profiles" / "default") is None  # config/config.yaml: sqlite
    assert yaml.safe_load((repo / "config" / "config.yaml").read_text())["tracking"] == "sqlite"


def test_slurm_form_script_and_resources(tmp_path: Path, capsys):
    """`lorarl tracking serve --slurm`: the profile's slurm.tracking resources, flags on top, one exec'd
    step (scancel's SIGTERM reaches the server); a malformed slurm.tracking is an error naming it."""
    from lorarl.tracking.slurm import profile_resources, sbatch_script

    res = profile_resources(Path(__file__).resolve().parents[2] / "profiles" / "slurm")
    assert res["partition"] == "cpu" and res["timeout_min"] == 10080
    script = sbatch_script(["python", "-m", "lorarl.cli", "tracking", "serve", "--host", "0.0.0.0"], tmp_path,
                           {**res, "cpus_per_task": 1, "sbatch": "--account=abc --qos=low"})
    lines = script.splitlines()
    assert "#SBATCH --partition=cpu" in lines and "#SBATCH --cpus-per-task=1" in lines
    assert "#SBATCH --time=10080" in lines and "#SBATCH --mem=4G" in lines
    assert "#SBATCH --account=abc" in lines and "#SBATCH --qos=low" in lines
    assert f"#SBATCH --output={tmp_path}/slurm-%j.out" in lines
    assert lines[-1] == "exec python -m lorarl.cli tracking serve --host 0.0.0.0"
    assert "#SBATCH --time=2-0" in sbatch_script(["x"], tmp_path, {"time": "2-0", "timeout_min": 5}).splitlines()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cluster.yaml").write_text("tracking: http://127.0.0.1:5000\nslurm:\n  tracking: cpu\n")
    with pytest.raises(TrackingError, match="slurm.tracking must be a mapping"):
        profile_resources(tmp_path / "bad")
    state = tmp_path / "state"
    assert cli.main(["tracking", "serve", "--slurm", "--profile", str(tmp_path / "bad"), "--state", str(state)]) == 2
    assert "slurm.tracking must be a mapping" in capsys.readouterr().err and not state.exists()  # nothing written
