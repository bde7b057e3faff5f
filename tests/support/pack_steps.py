"""Packed cells over full steps: a cell of the tiny model, fake-graded regimes, trained weights, and the check that a
pack of K equals K packs of one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


NOISY = ("time/", "pack/step_s", "tokens_per_s", "pack/cells", "step_time")  # wall-clock and pack size: not part of the result


def cell(tiny_dir, cid, seed, beta=0.0, regime="outcome", lr=1e-2, steps=3, monitor=2, method="lora", init=None,
         temperature=1.0, top_p=1.0, rank=4, alpha=8):
    from lorarl.language.config import CellConfig

    adapter = {"method": method, "rank": rank, "alpha": alpha, "dropout": 0.0, **({"init": init} if init else {})}
    cfg = CellConfig(model=str(tiny_dir), seed=seed,
                     task={"name": "synthetic", "seed": 7, "n_train": 12, "n_eval": 4, "max_value": 9},
                     adapter=adapter,
                     reward={"regime": regime},
                     train={"lr": lr, "steps": steps, "prompts_per_step": 2, "generations": 2,
                            "max_completion_length": 8, "beta": beta, "kl_monitor_every": monitor,
                            "temperature": temperature, "top_p": top_p,
                            "lr_scheduler": "linear"})
    return SimpleNamespace(id=cid, config=cfg)


def fake_regimes(pack):
    """Outcome cells graded by a deterministic, non-degenerate fake (an untrained model is never right)."""
    from lorarl.rewards.outcome import OutcomeDeposits
    from tests.support.grpo import fake_score

    for m in pack.loop.members:
        if m.regime.name == "outcome":
            m.regime = OutcomeDeposits(score_fn=fake_score)
    return pack


def trained(pack, k):
    return {n: p.detach().clone() for n, p in pack.loop.trainer.cells[k].model.named_parameters() if p.requires_grad}


def clean(row):
    return {k: v for k, v in row.items() if not k.startswith(NOISY)}


def pack_of_k_full_steps_equals_k_packs_of_one(tiny_dir, tmp_path):
    from lorarl.pack.build import build_pack

    cells = [cell(tiny_dir, "a", 1), cell(tiny_dir, "b", 2, beta=0.05, temperature=0.7, top_p=0.9),
             cell(tiny_dir, "c", 3, regime="process", lr=5e-3, temperature=1.3)]
    pack = fake_regimes(build_pack(cells, results_dir=tmp_path, device="cpu"))
    start = [trained(pack, k) for k in range(3)]
    from lorarl import ledger

    ledger.begin(in_process=True)
    rows = [pack.loop.step() for _ in range(3)]
    assert pack.loop.step() == {}  # every member reached its train.steps
    # the cost ledger (lorarl.ledger): each member's tokens (the key of the pack's split), the steps' phases
    rec = ledger.record("pack", study="s", cell="a,b,c", outcome="completed", threads=1)
    assert rec["members"] == {n: pytest.approx(sum(r[n]["rollout/tokens"] for r in rows), abs=0.1) for n in "abc"}
    assert rec["steps"] == 3 and rec["member_steps"] == {"a": 3, "b": 3, "c": 3}
    walls = sum(r["a"]["pack/step_s"] for r in rows)
    monitors = sum(max(r[n].get("time/kl_monitor_s", 0.0) for n in "abc") for r in rows)  # after a step's end
    in_steps = sum(rec["phases_s"].get(p, 0.0) for p in ("generation", "reward", "reference", "update", "handoff"))
    assert walls - 0.01 <= in_steps <= walls + monitors + 0.01 and rec["phases_s"]["generation"] > 0
    assert all(set(r) == {"a", "b", "c"} for r in rows)
    assert "kl" in rows[0]["b"] and "kl" not in rows[0]["a"]  # beta > 0: the KL term; beta = 0: none
    assert "kl_new_old" in rows[1]["a"] and "kl_ref/k3" in rows[1]["a"]  # monitors at step 2 (every 2)
    assert all(r["c"]["deposits/per_completion"] >= 0 for r in rows)
    for r in rows:  # per-cell step times (not the pack's wall time copied): they add up to the pack's
        times = [r[n]["time/step_s"] for n in "abc"]
        assert all(0 < t < r["a"]["pack/step_s"] for t in times) and len(set(times)) == 3
        assert sum(times) == pytest.approx(r["a"]["pack/step_s"], rel=1e-6)
    for k, c in enumerate(cells):
        solo = fake_regimes(build_pack([c], results_dir=tmp_path, device="cpu"))
        solo_rows = [solo.loop.step() for _ in range(3)]
        mine, alone = trained(pack, k), trained(solo, 0)
        assert mine.keys() == alone.keys()
        assert all(torch.equal(mine[n], alone[n]) for n in mine), c.id  # bit for bit
        if c.id != "c":  # (the process cell's rule checker may give an untrained model equal scores)
            assert any(not torch.equal(mine[n], start[k][n]) for n in mine)  # and it trained
        for i in range(3):
            assert clean(rows[i][c.id]) == clean(solo_rows[i][c.id]), (c.id, i)
        m, s = pack.loop.members[k], solo.loop.members[0]
        assert torch.equal(m.sampler.get_state(), s.sampler.get_state())  # same draws, no more
        assert m.order.state_dict()["perm"] == s.order.state_dict()["perm"]


def residual_init_cells_pack_and_equal_their_solo_runs(tiny_dir, tmp_path, method, init):
    """Residual inits write W0 - s·B0A0 into the ONE shared base; every member starts from W0 and writes
    the same residual, so the pack trains each cell exactly as alone (bit for bit) on that residual base."""
    from lorarl.pack.build import build_pack
    from lorarl.pack.plan import pack_key
    from lorarl.pack.routing import lora_layers

    cells = [cell(tiny_dir, "a", 1, method=method, init=init),
             cell(tiny_dir, "b", 2, beta=0.05, lr=5e-3, method=method, init=init)]
    assert pack_key(cells[0].config) is not None and pack_key(cells[0].config) == pack_key(cells[1].config)
    pack = fake_regimes(build_pack(cells, results_dir=tmp_path, device="cpu"))
    rows = [pack.loop.step() for _ in range(3)]
    for k, c in enumerate(cells):
        solo = fake_regimes(build_pack([c], results_dir=tmp_path, device="cpu"))
        packed_layers, solo_layers = lora_layers(pack.loop.trainer.cells[k].model), lora_layers(solo.loop.trainer.cells[0].model)
        for n, layer in solo_layers.items():  # the same residual base as the cell alone (not subtracted twice)
            assert torch.equal(packed_layers[n].get_base_layer().weight, layer.get_base_layer().weight), n
        assert pack.policies[k].ctx.init_factors  # the residual is recorded for the save on the original base
        solo_rows = [solo.loop.step() for _ in range(3)]
        mine, alone = trained(pack, k), trained(solo, 0)
        assert mine.keys() == alone.keys() and all(torch.equal(mine[n], alone[n]) for n in mine), c.id
        for i in range(3):
            assert clean(rows[i][c.id]) == clean(solo_rows[i][c.id]), (c.id, i)
