"""A pack job on several ranks (lorarl.pack.ranks): members placed over the ranks, each rank a pack of its own.

The slow test launches a 3-member pack as a 2-task job (`lorarl launch pack` on the local executor: submitit's
ranks, as on Slurm) and checks every member's staged outputs equal the one-process pack's (to 1e-6; bit for
bit on a CPU whose matrix kernels are batch-invariant); the fast ones hold the placement, the job's layout and the rendezvous's failure paths."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import time

import pytest

from tests.support.pack_job_ranks import _launch_pack, _study, assert_two_rank_pack_equals_one


def test_members_are_placed_round_robin_and_the_job_has_no_more_ranks_than_members():
    from lorarl.pack.ranks import place
    from lorarl.pipeline.jobs.train_layout import pack_resources
    from types import SimpleNamespace

    assert [place(list("abcde"), r, 2) for r in (0, 1)] == [list("ace"), list("bd")]
    assert place(["a"], 1, 2) == []
    cfgs = lambda n: [SimpleNamespace(model="m", reward=SimpleNamespace(teacher_model=None, prm_model=None))] * n  # noqa: E731
    assert pack_resources({"tasks_per_node": 2}, "s", cfgs(3), "local")["tasks_per_node"] == 2
    one = pack_resources({"gpus_per_node": 8, "layouts": {"by_model": {"m": {"gpus_per_node": 4}}}}, "s", cfgs(2), "slurm")
    assert (one["tasks_per_node"], one["gpus_per_node"]) == (2, 2)  # 2 members: 2 ranks, 2 GPUs asked for
    multi = pack_resources({"nodes": 4, "gpus_per_node": 8}, "s", cfgs(10), "slurm")
    assert (multi["nodes"], multi["tasks_per_node"]) == (2, 8)  # 10 members need 2 nodes of 8, not 4
    assert "layouts" not in one
    from lorarl.pipeline.jobs.train_layout import pack_layout

    prof = {"tasks_per_node": 1, "layouts": {"on_oom": {"tasks_per_node": 8}}}
    assert pack_layout(prof, "s", cfgs(3), "local", False) == ({"tasks_per_node": 1}, None)
    assert pack_layout(prof, "s", cfgs(3), "local", True) == ({"tasks_per_node": 3}, "3 ranks (1 node(s))")
    assert pack_layout(prof, "s", cfgs(1), "local", True)[1] is None  # one member: no more ranks to use


def test_a_pack_rank_sees_only_its_gpu(monkeypatch):
    from lorarl.pack.ranks import pin_gpu

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # Slurm's grant on this node
    pin_gpu()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # no grant named: the node's own numbering
    pin_gpu()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, behaviour: str, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LORARL_COLLECTIVE_TIMEOUT_S="2")
    from lorarl.pack.ranks import Rendezvous

    meet = Rendezvous("pack-test", rank, 2)
    if rank == 1:
        if behaviour == "ok":
            time.sleep(3)  # longer than the timeout: a rank that beats is waited for
            meet.report({"trained": ["b"]})
        elif behaviour == "error":
            meet.report({"error": "ValueError: bad member"})
        else:  # killed: no report, no more beats
            os._exit(9)
        return
    meet.report({"trained": ["a"]})
    try:
        q.put(("ok", meet.gather()))
    except RuntimeError as err:
        q.put(("raised", str(err)))


@pytest.mark.parametrize("behaviour", ["ok", "error", "killed"])
def test_rank_zero_gathers_every_report_or_fails_in_bounded_time(behaviour):
    ctx = mp.get_context("fork")
    q, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, behaviour, q)) for r in (0, 1)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    kind, got = q.get(timeout=60)
    for p in procs:
        p.join(timeout=30)
    if behaviour == "ok":
        assert kind == "ok" and got == [{"trained": ["a"]}, {"trained": ["b"]}]
    elif behaviour == "error":
        assert kind == "raised" and "rank 1: ValueError: bad member" in got
    else:
        assert kind == "raised" and "rank 1 stopped answering" in got and time.monotonic() - t0 < 30


@pytest.mark.slow
def test_a_two_rank_pack_job_trains_what_the_one_process_pack_trains(tiny_dir, tmp_path):
    assert_two_rank_pack_equals_one(_study(tmp_path, tiny_dir), tmp_path)


@pytest.mark.slow
def test_the_last_out_of_memory_retry_of_a_pack_runs_on_more_ranks(tiny_dir, tmp_path):
    """The ladder's last rung for a pack job: the profile's larger layout (``layouts.on_oom``), so each rank holds
    fewer members; without one the attempt is refused. Test hook: a pack job of fewer than 2 ranks runs out
    of memory."""
    from lorarl.pack.plan import pack_id
    from lorarl.pipeline.jobs import oom
    from lorarl.language.study import cell_table, load_study

    study = _study(tmp_path, tiny_dir, kls=(0.0, 0.05))
    ids = [c.id for c in cell_table(load_study(str(study))).cells]
    logs = tmp_path / "pk" / ".packs" / pack_id(ids) / "logs"
    logs.mkdir(parents=True)
    error = "torch.OutOfMemoryError: CUDA out of memory: 1 rank(s) < 2 (test hook LORARL_FAULT=oom_ranks_below:2)"
    (logs / oom.RECORD).write_text(json.dumps([{"attempt": k, "oom": True, "error": error, "failed": None}
                                               for k in (1, 2, 3)]))
    hook = {"attempt": 4, "LORARL_FAULT": "oom_ranks_below:2"}
    refused = _launch_pack(study, ids, tmp_path, slurm={}, **hook)
    assert refused.returncode == 1 and "no larger layout allowed by the profile" in refused.stderr
    last = _launch_pack(study, ids, tmp_path, slurm={"layouts": {"on_oom": {"tasks_per_node": 4}}}, **hook)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    assert "retrying on the larger layout the profile allows: 2 ranks (1 node(s))" in last.stdout  # 2 members: 2
    for c in ids:
        summary = json.loads((tmp_path / "pk" / c / ".packed" / "summary.json").read_text())
        assert summary["state"] == "done" and summary["oom_retries"][-1]["attempt"] == 4
        assert summary["oom_retries"][-1]["ranks"] == 2 and "ranks" not in summary["oom_retries"][0]
