"""Hub references checked before a study runs (lorarl.language.hubcheck): a model, teacher, PRM or dataset that is neither
in the local Hugging Face cache nor reachable refuses the study with exit 2, naming it and its field, before
anything runs or is written (`lorarl run`, `lorarl doctor`, Snakemake); `lorarl cells` and `lorarl status` list
such a study and name what this machine cannot get, after one short probe of the hub; a cached one passes;
`hub_check: false` / LORARL_HUB_CHECK=0 lets it through. No test touches the network: the hub is HF_HUB_OFFLINE,
a closed or silent loopback port, a name whose lookup never answers, or a local server."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from lorarl.language import hubcheck, hubreach
from lorarl.pipeline.drills import recovery
from lorarl.language.study import StudyError, cell_table, load_study, load_study_to_run

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def study_file(tmp_path: Path, **defaults) -> Path:
    spec = {"name": "mine", "defaults": {"model": QWEN, **defaults},
            "axes": {"seed": {"field": "seed", "prefix": "s", "values": [0]}}}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def hf(tmp_path: Path, monkeypatch) -> Path:
    """An empty Hugging Face home, offline: nothing is cached and the hub is never asked."""
    home = tmp_path / "hf"
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", hubcheck.ENV, "TRANSFORMERS_OFFLINE",
                "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def cache_model(home: Path, repo: str, files: dict[str, str]) -> Path:
    """A model in the hub cache's layout (refs/main -> snapshots/<sha>/...), as `hf download` leaves it."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(SHA)
    snap = root / "snapshots" / SHA
    snap.mkdir(parents=True)
    for name, text in {"config.json": "{}", **files}.items():
        (snap / name).write_text(text)
    return snap


def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once (a machine without network)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_uncached_model_is_listed_by_lorarl_cells_and_refused_by_snakemake(tmp_path, hf, capsys, monkeypatch):
    from lorarl import cli

    study = study_file(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE" and not k.lower().endswith("_proxy")}
    env.update(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")  # no hub: the connection is refused
    cells = subprocess.run([sys.executable, "-m", "lorarl.cli", "cells", str(study)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert cells.returncode == 0, cells.stdout + cells.stderr
    assert cells.stdout.splitlines()[1].startswith("s0 ") and "1 cells in study 'mine'" in cells.stdout
    assert (f"cannot run here: defaults.model: model '{QWEN}': not in the local cache" in cells.stdout
            and "the hub is unreachable" in cells.stdout and "Connection refused" in cells.stdout), cells.stdout
    assert cli.main(["cells", str(study), "--json"]) == 0  # (HF_HUB_OFFLINE) stdout stays JSON; the lines: stderr
    got = capsys.readouterr()
    assert [c["id"] for c in json.loads(got.out)] == ["s0"] and "HF_HUB_OFFLINE is set" in got.err
    env["HF_HUB_OFFLINE"] = "1"
    root = recovery.workspace(tmp_path / "ws", {"studies": [str(study)]})
    snake = subprocess.run(["snakemake", "all"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert snake.returncode == 2, snake.stdout[-2000:] + snake.stderr[-2000:]
    assert QWEN in snake.stderr and "defaults.model" in snake.stderr and "HF_HUB_OFFLINE" in snake.stderr
    assert not (root / "results").exists() and not (tmp_path / "results").exists()


def test_a_cached_model_passes_and_an_incomplete_one_does_not(tmp_path, hf):
    snap = cache_model(hf, QWEN, {"model.safetensors.index.json": json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}),
        "model-00001-of-00002.safetensors": "w"})
    study = study_file(tmp_path)
    with pytest.raises(StudyError, match="Qwen2.5-0.5B-Instruct"):  # a shard the index names is missing
        load_study_to_run(study)
    (snap / "model-00002-of-00002.safetensors").write_text("w")
    assert load_study_to_run(study).name == "mine"


def test_the_switch_lets_an_uncached_model_through(tmp_path, hf, monkeypatch):
    study = study_file(tmp_path)
    assert load_study_to_run(study, hub_check="false").name == "mine"  # the profile's `hub_check: false`
    monkeypatch.setenv(hubcheck.ENV, "0")
    assert load_study_to_run(study).name == "mine"
    assert not hubcheck.enabled(True) and not hubcheck.enabled(False)


def test_references_name_every_model_and_dataset_with_its_revision(tmp_path, hf):
    rd = load_study("experiments/reward_density.yaml")  # student, Qwen3-8B teacher, Math-Shepherd PRM, MATH data
    refs = {(r.field, r.kind, r.repo) for c in cell_table(rd).cells for r in hubcheck.references(c.config)}
    assert {("model", "model", "Qwen/Qwen3-1.7B-Base"), ("reward.teacher", "model", "Qwen/Qwen3-8B"),
            ("reward.prm_model", "model", "peiyi9979/math-shepherd-mistral-7b-prm"),
            ("task.path", "dataset", "DigitalLearningGmbH/MATH-lighteval"),
            ("eval.benchmarks.math500", "dataset", "HuggingFaceH4/MATH-500")} <= refs
    masks = load_study("experiments/off_principal_masks.yaml")  # a mixture with an hf:// parquet file
    refs = {r for r in hubcheck.references(cell_table(masks).cells[0].config)}
    assert any(r.kind == "file" and r.repo == "hkust-nlp/SimpleRL-Zoo-Data" and r.filename.endswith(".parquet")
               for r in refs)
    pinned = cell_table(masks).cells[0].config.model_copy(deep=True)
    pinned.task.sources[0].revision = SHA
    assert [r.revision for r in hubcheck.references(pinned) if r.field == "task.sources[0].path"] == [SHA]
    at = hubcheck._hf_file("task.path", f"hf://datasets/openai/gsm8k@{OTHER}/main/train.parquet", SHA)
    assert (at.repo, at.revision, at.filename) == ("openai/gsm8k", OTHER, "main/train.parquet")  # the address's
    assert hubcheck._hf_file("task.path", "hf://datasets/openai/gsm8k/main/train.parquet", SHA).revision == SHA
    assert hubcheck.references(cell_table(load_study("experiments/demo.yaml")).cells[0].config) == []


def test_a_dataset_is_cached_at_the_pinned_revision_only(hf):
    # the datasets cache's folder names (datasets.naming.camelcase_to_snakecase, 5.2.0, as it names them)
    assert [hubcheck._snake(n) for n in ("DeepScaleR-Preview-Dataset", "MATH-500", "MyMath")] == [
        "deep_scale_r-preview-dataset", "math-500", "my_math"]
    prepared = hf / "datasets" / "org___my_math" / "main" / "0.0.0" / SHA  # datasets' prepared-arrow layout
    prepared.mkdir(parents=True)
    (prepared / "dataset_info.json").write_text("{}")
    ref = hubcheck.Ref("task.path", "org/MyMath", "dataset", "org/MyMath", None, "main")
    assert hubcheck.cached(ref) and hubcheck.cached(hubcheck.Ref(**{**ref.__dict__, "revision": SHA}))
    assert not hubcheck.cached(hubcheck.Ref(**{**ref.__dict__, "revision": OTHER}))
    assert not hubcheck.cached(hubcheck.Ref(**{**ref.__dict__, "config": "other"}))
    refs = hf / "hub" / "datasets--org--MyMath" / "refs"  # a tag is resolved through the hub cache's refs
    refs.mkdir(parents=True)
    (refs / "v1").write_text(SHA)
    assert hubcheck.cached(hubcheck.Ref(**{**ref.__dict__, "revision": "v1"}))
    assert [why for _, why in hubcheck.problems([hubcheck.Ref(**{**ref.__dict__, "revision": OTHER})])] == [
        "the hub is not asked (HF_HUB_OFFLINE is set)"]
    snap = hf / "hub" / "datasets--openai--gsm8k" / "snapshots" / SHA / "main"  # an hf:// file: the hub cache
    snap.mkdir(parents=True)
    (snap / "train.parquet").write_text("p")
    (hf / "hub" / "datasets--openai--gsm8k" / "refs").mkdir()
    (hf / "hub" / "datasets--openai--gsm8k" / "refs" / "main").write_text(SHA)
    for rev, there in ((None, True), (SHA, True), (OTHER, False)):
        assert hubcheck.cached(hubcheck._hf_file("task.path", "hf://datasets/openai/gsm8k/main/train.parquet", rev)) is there


class Hub(http.server.BaseHTTPRequestHandler):
    """A local stand-in for the hub's API: one model exists, everything else is 404 RepoNotFound."""

    def do_GET(self):  # noqa: N802 - http.server's name
        found = self.path.startswith(f"/api/models/{QWEN}")
        body = json.dumps({"id": QWEN, "sha": SHA} if found else {"error": "Repository not found"}).encode()
        self.send_response(200 if found else 404)
        if not found:
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_uncached_model_the_hub_answers_for_passes_a_missing_or_silent_one_does_not(tmp_path, hf, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert load_study_to_run(study_file(tmp_path)).name == "mine"
        (tmp_path / "b").mkdir()
        with pytest.raises(StudyError, match="nobody/nothing.*no such repository"):
            load_study_to_run(study_file(tmp_path / "b", model="nobody/nothing"))
        from lorarl import cli  # listing a study that names what does not exist: refused as well

        assert cli.main(["cells", str(tmp_path / "b" / "mine.yaml")]) == 2
    finally:
        server.shutdown()
    silent = socket.socket()  # accepts connections, never answers: the check gives up at its deadline
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(hubcheck, "TIMEOUT_S", 0.5)
        (tmp_path / "c").mkdir()
        with pytest.raises(StudyError, match=r"Qwen2.5-0.5B-Instruct.*the hub is unreachable .*no answer in 0.5 s"):
            load_study_to_run(study_file(tmp_path / "c"))
    finally:
        silent.close()


def test_status_names_the_reference_a_study_that_never_started_cannot_run_here(hf, tmp_path, capsys, monkeypatch):
    """Issue 37 item 9: `lorarl status` of such a study names the missing model (no line once it is cached)."""
    from lorarl import cli

    path = study_file(tmp_path)
    assert cli.main(["status", str(path), "--results", str(tmp_path / "results")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"cannot run here: defaults.model: model '{QWEN}': not in the local cache"), last
    cache_model(hf, QWEN, {"model.safetensors": "weights"})
    assert cli.main(["status", str(path), "--results", str(tmp_path / "results")]) == 0
    assert "cannot run here" not in capsys.readouterr().out


@pytest.fixture
def no_network(hf, monkeypatch):
    """A machine without network: HF_HUB_OFFLINE unset, the hub at a name whose lookup never answers (a resolver
    that is not there); every lookup of it is counted (each is one connection attempt)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.lorarl.invalid")
    lookups, never = [], threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host != "hub.lorarl.invalid":
            return real(host, *args, **kwargs)
        lookups.append(host)
        never.wait(60)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield lookups
    never.set()


def test_without_network_cells_and_status_list_a_published_study_after_one_short_probe(no_network, tmp_path, capsys,
                                                                                      monkeypatch):
    """Issue 45 item 7: `lorarl cells` / `lorarl status` of a published study, no network: every cell listed, every
    hub reference this machine cannot get named, exit 0, one connection attempt each, given PROBE_S (not the
    5 s of a run); `lorarl run` and `lorarl doctor` still refuse the study (exit 2) after one attempt each."""
    from lorarl import cli

    study = "experiments/kl_free.yaml"
    table = cell_table(load_study(study))
    refs = {(r.field, r.repo) for c in [*table.cells, *table.bases] for r in hubcheck.references(c.config)}
    assert cli.main(["cells", study]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{c.id} " in out for c in table.cells) and f"{len(table.cells)} cells in study 'kl_free'" in out
    cannot = [line for line in out.splitlines() if line.startswith("cannot run here: ")]
    assert len(cannot) == len(refs) >= 5 and all(repo in out for _, repo in refs), out
    assert all(f"the hub is unreachable (https://hub.lorarl.invalid: no answer in {hubcheck.PROBE_S:g} s)" in line
               for line in cannot), cannot
    assert re.search(rf"^{len(refs)} Hugging Face reference\(s\) this machine cannot get", out, re.M)
    assert no_network == ["hub.lorarl.invalid"]  # one probe, no question per reference
    assert cli.main(["status", study, "--results", str(tmp_path / "results")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cannot run here: ")]
    assert len(notes) == len(refs) and len(no_network) == 2
    monkeypatch.setattr(hubcheck, "TIMEOUT_S", 1.0)  # a run's deadline (5 s), shortened for the test
    assert cli.main(["run", study, table.cells[0].id, "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"invalid study {study}: {len(refs)} Hugging Face reference(s) neither cached here nor reachable" in err
    assert "no answer in 1 s" in err and len(no_network) == 3 and not (tmp_path / "results").exists()
    assert cli.main(["doctor", study, "--results", str(tmp_path / "results")]) == 2  # as Snakemake would plan it
    assert "neither cached here nor reachable" in capsys.readouterr().err and len(no_network) == 4
    assert not (tmp_path / "results").exists()


def test_the_probe_goes_where_the_hub_client_connects(monkeypatch):
    """The one probe is an HTTP request to the endpoint, or through the proxy the environment names for it (as
    httpx, the hub's client, reads HTTPS_PROXY / ALL_PROXY / NO_PROXY): any HTTP status is an answer; a refused
    connection says so, and a socket that accepts the connection and never answers is no answer."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert hubreach._proxy("https://huggingface.co") is None
    monkeypatch.setenv("HTTPS_PROXY", "proxy.site:3128")
    assert hubreach._proxy("https://huggingface.co") == "http://proxy.site:3128"
    assert hubreach._proxy("http://127.0.0.1:8080") is None
    monkeypatch.setenv("ALL_PROXY", "socks5://proxy.site:1080")
    assert hubreach._proxy("http://127.0.0.1:8080") == "socks5://proxy.site:1080"
    monkeypatch.setenv("NO_PROXY", "huggingface.co,127.0.0.1")
    assert hubreach._proxy("https://huggingface.co") is None and hubreach._proxy("http://127.0.0.1:8080") is None
    monkeypatch.delenv("ALL_PROXY")
    port = closed_port()
    assert hubreach.reach(f"http://127.0.0.1:{port}", 5.0) == "Connection refused"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)  # answers HEAD with 501: an answer all the same
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert hubreach.reach(f"http://127.0.0.1:{server.server_address[1]}", 5.0) is None
    finally:
        server.shutdown()
    with socket.socket() as silent:  # accepts every connection (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert hubreach.reach(url, 0.3) == "no answer in 0.3 s"
        monkeypatch.delenv("NO_PROXY")
        monkeypatch.setenv("HTTPS_PROXY", url)  # a proxy that accepts and never answers: the same
        assert hubreach.reach("https://huggingface.co", 0.3) == "no answer in 0.3 s"
        monkeypatch.setenv("HTTPS_PROXY", url.replace("http:", "https:"))  # TLS to the proxy (urllib cannot): its
        assert hubreach.reach("https://huggingface.co", 0.3) is None  # connection only, as the probe once was


def test_a_hub_that_accepts_and_never_answers_is_told_by_the_listing_probe(hf, tmp_path, capsys, monkeypatch):
    """Issue 45 item 7: a firewall, sandbox or proxy that accepts every connection and never answers (a TCP probe
    would take it for the hub) costs listing a published study its `PROBE_S`, not a question per reference (5 s):
    no reference is asked, and the probe runs while the study loads."""
    from lorarl import cli
    from lorarl.language import study as study_mod

    monkeypatch.delenv("HF_HUB_OFFLINE")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    asked, order = [], []
    monkeypatch.setattr(hubreach, "_ask", lambda *a: asked.append(a) or "unreachable: no answer")
    early, load = hubcheck.early_probe, study_mod.load_study
    monkeypatch.setattr(hubcheck, "early_probe", lambda: order.append("probe") or early())
    monkeypatch.setattr(study_mod, "load_study", lambda path: order.append("load") or load(path))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        start = time.monotonic()
        assert cli.main(["cells", "experiments/peft_zoo.yaml"]) == 0
        took = time.monotonic() - start
        study = load_study("experiments/peft_zoo.yaml")
        cells = [*cell_table(study).cells, *cell_table(study).bases]
        start = time.monotonic()  # the offline answer itself, the study loaded: the probe's 0.5 s and the cache
        assert len(hubcheck.listing(study, cells, "experiments/peft_zoo.yaml")) >= 5
        assert time.monotonic() - start < 1.0
    cannot = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cannot run here: ")]
    assert len(cannot) >= 5 and all(f"no answer in {hubcheck.PROBE_S:g} s)" in line for line in cannot), cannot
    assert asked == [] and order == ["probe", "load"]
    assert took < hubcheck.TIMEOUT_S - 1, took  # (a question per reference waited out the run's 5 s)


def test_a_command_ending_before_it_asks_waits_out_the_probe(hf, tmp_path, monkeypatch):
    """A bad study ends `lorarl cells` (exit 2) while the early probe is still in the network code: the exit waits
    for the probe, at most its deadline (`Probe.settle` at exit), so no daemon thread is inside ssl/socket code while
    the interpreter finalises (a SIGSEGV, exit -11, was seen there under load)."""
    registered = []
    monkeypatch.setattr(hubreach.atexit, "register", registered.append)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        probe = hubreach.Probe(0.3, url)
        assert registered == [probe.settle]
        start = time.monotonic()
        probe.settle()
        assert not probe._thread.is_alive() and time.monotonic() - start < 0.7
        bad = study_file(tmp_path, adapter={"method": "lorax"})
        env = {**os.environ, "HF_ENDPOINT": url}
        env.pop("HF_HUB_OFFLINE", None)
        proc = subprocess.run([sys.executable, "-m", "lorarl.cli", "cells", str(bad)], env=env, capture_output=True,
                              text=True, timeout=120)
    assert proc.returncode == 2 and "method 'lorax'" in proc.stderr, (proc.returncode, proc.stderr[-500:])
