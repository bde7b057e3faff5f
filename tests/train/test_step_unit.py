"""``train.steps`` counts training steps, the papers' unit: one rollout batch of P prompts x G completions,
with ``updates_per_step`` optimiser updates inside (PPO mini-batches x epochs). Each published study's
rollout count and update count equal its paper's; TRL's max_steps, logging, warm-up, snapshots, KL monitors
and checkpoints follow; and only cells whose two counts differ changed their training signature."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lorarl.language.config import CellConfig
from lorarl.language.signature import _train_part, short_hash, train_signature
from lorarl.language.study import load_study, study_cells

ROOT = Path(__file__).resolve().parents[2]

# study: (rollout steps, optimiser updates, the paper's words)
PAPERS = {
    "kl_free": (300, 300, "000 §6: 300 steps, batch 32"),
    "kl_free_gemma_ablation": (300, 300, "000 §6: 300 steps"),
    "reward_density": (100, 100, "001 Table 1: 100 rollout steps, 1 epoch per rollout"),
    "peft_zoo": (1024, 1024, "002 §2.4: 1024 steps, global batch 128 (grad. accumulation inside one update)"),
    "peft_zoo_ablations": (1024, 1024, "002 §2.4 / Table 4: 1024 steps"),
    "peft_zoo_7b": (8192, 8192, "002 §2.4: 7B over 8,192 steps"),
    "init_geometry": (500, 2000, "003 App. C.1 Table 2: 500 verl steps of 128 prompts, PPO mini-batch 32"),
    "init_geometry_7b": (150, 150, "003 App. D.2: 150 optimisation steps, batch 4 prompts x 8"),
    "off_principal_masks": (500, 2000, "004 App. C.1: 4 gradient updates per step; Tables 4-5: 320 / 500 steps"),
    "off_principal_lora_pissa": (200, 800, "004 App. C.1: 200 steps, four gradient updates per step"),
}


def _cells(name):
    return study_cells(load_study(str(ROOT / "experiments" / f"{name}.yaml")))


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_published_rollouts_and_updates_equal_the_papers(name):
    rollouts, updates, _where = PAPERS[name]
    for cell in _cells(name):
        t = cell.config.train
        assert (t.steps, t.optimizer_updates) == (rollouts, updates), (name, cell.id)


def test_every_published_study_is_in_the_table():
    published = {p.stem for p in (ROOT / "experiments").glob("*.yaml")
                 if not p.stem.endswith("_cpu") and p.stem not in ("demo", "demo_adaptive", "kl_bound_toy")}  # the toy has no GRPO
    assert published == set(PAPERS)


def test_004_table4_snapshot_is_rollout_step_320():
    """004 Table 4 reads step 320 (of 4 updates each): the snapshot is training step 320 = update 1,280."""
    from lorarl.language.evalplan.plan import snapshot_steps

    for cell in _cells("off_principal_masks"):
        assert snapshot_steps(cell.config) == [320] and cell.config.train.updates_per_step == 4


@pytest.mark.parametrize("twin, rollouts, updates", [("init_geometry_cpu", 8, 32), ("off_principal_masks_cpu", 5, 20),
                                                     ("off_principal_lora_pissa_cpu", 2, 8)])
def test_cpu_twins_keep_their_updates(twin, rollouts, updates):
    for cell in _cells(twin):
        assert (cell.config.train.steps, cell.config.train.optimizer_updates) == (rollouts, updates)


def _cfg(**train):
    base = {"steps": 5, "prompts_per_step": 8, "generations": 2, "max_completion_length": 6, "kl_monitor_every": 0}
    return CellConfig.model_validate({"train": {**base, **train}})


def test_trl_counts_updates_and_logs_one_row_per_step(tmp_path):
    from lorarl.train.trl_args import grpo_args

    a = grpo_args(_cfg(mini_batch_prompts=2, num_iterations=2, log_every=3, warmup_ratio=0.1,
                       lr_scheduler="cosine"), tmp_path, use_cpu=True)
    assert a.max_steps == 5 * 4 * 2 and a.logging_steps == 3 * 8
    assert a.get_warmup_steps(a.max_steps) == 4  # warm-up: a fraction of the optimiser updates
    plain = grpo_args(_cfg(), tmp_path, use_cpu=True)
    assert (plain.max_steps, plain.logging_steps) == (5, 1)


def test_cosine_spans_every_update(tmp_path):
    """003's cosine schedule: over all 2,000 updates of its 500 steps (the lr reaches ~0 at the last one)."""
    import torch
    from transformers import get_scheduler

    from lorarl.train.trl_args import grpo_args

    cfg = _cells("init_geometry")[0].config.model_copy(deep=True)
    cfg.train.lr_scheduler = "cosine"
    a = grpo_args(cfg, tmp_path, use_cpu=True)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(a.lr_scheduler_type, opt, num_warmup_steps=a.get_warmup_steps(a.max_steps),
                          num_training_steps=a.max_steps)
    lrs = []
    for _ in range(a.max_steps):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert a.max_steps == 2000 and lrs[1000] == pytest.approx(0.5, abs=1e-3) and lrs[-1] < 1e-5


def test_signature_changes_only_where_the_meaning_did():
    from lorarl.language.signature import signature_dump

    one, four = _cfg(), _cfg(mini_batch_prompts=2)

    def plain(c):  # the signature as it was computed before steps counted rollouts (no derived keys)
        d = signature_dump(c)
        d["train"].pop("updates_per_step", None)
        return short_hash(_train_part(d))

    assert train_signature(one) == plain(one)  # one update per step: the hash is the one it always was
    assert train_signature(four) != plain(four)  # the same YAML now trains 4x as long: a new hash
    assert signature_dump(four)["train"]["updates_per_step"] == 4
    CellConfig.model_validate(four.model_dump())  # the dump itself stays a valid config


def test_snapshots_and_rows_are_in_training_steps(tmp_path):
    from lorarl.train.callbacks import MetricsRecorder
    from lorarl.train.snapshots import SnapshotSaver

    saved = []
    snap = SnapshotSaver(tmp_path / "s", [3], lambda p, m: (saved.append(p.name), p.mkdir(parents=True)),
                         updates_per_step=4)
    for g in range(1, 21):
        snap.on_step_end(None, SimpleNamespace(global_step=g, is_world_process_zero=True), None, model=object())
    assert saved == [".step-3.tmp"] and snap.saved == [3] and (tmp_path / "s" / "step-3").is_dir()

    rec = MetricsRecorder(tmp_path / "m.csv", None, updates_per_step=4)
    for g in range(1, 9):
        rec.on_step_begin(None, None, None)
        rec.on_step_end(None, None, None)
        if g % 4 == 0:
            rec.on_log(None, SimpleNamespace(global_step=g), None, logs={"loss": 0.1})
    assert [(r["step"], r["update"]) for r in rec.rows] == [(1, 4), (2, 8)]


def test_kl_monitor_counts_training_steps(tiny_dir, tmp_path):
    """kl_monitor_every 1 with 2 updates per step: the monitors run after updates 2 and 4 (the steps' ends)."""
    from tests.support.grpo import metric_steps
    from tests.support.grpo_knobs import build, cfg_with

    trainer, _ = build(tiny_dir, tmp_path, cfg_with(steps=2, prompts_per_step=2, mini_batch_prompts=1, kl_monitor_every=1))
    ran, real = [], trainer._monitors
    trainer._monitors = lambda: ran.append(trainer.state.global_step) or real()
    trainer.train()
    assert trainer.state.global_step == 4 and ran == [2, 4]
    assert metric_steps(trainer, "time/kl_new_old_s") == [2, 4]


def test_rollout_kl_spans_the_steps_updates(tiny_dir, tmp_path):
    """Paper 003 Figs. 5/6: KL(pi_new || pi_old) from the rollout policy (TRL's old log-probs of the batch)
    to the policy after both mini-batch updates (`kl_new_old`), and the last update's alone
    (`kl_new_old/update`): distinct names, and with two updates the two differ."""
    import torch

    from tests.support.grpo_knobs import build, cfg_with

    trainer, _ = build(tiny_dir, tmp_path, cfg_with(steps=1, prompts_per_step=2, mini_batch_prompts=1, kl_monitor_every=1,
                                                    lr=0.05))
    seen, real = {}, trainer._monitors

    def spy():
        batch, logp_BT = trainer._last_batch
        seen.update(rollout=batch["old_per_token_logps"].clone(), before=logp_BT.clone(), mask=batch["completion_mask"])
        real()
        seen["new"] = trainer._forward_logps(trainer.model, batch)

    trainer._monitors = spy
    trainer.train()
    row = [h for h in trainer.state.log_history if "kl_new_old" in h][0]

    def kl(new, old):
        r = torch.exp(new - old)
        return float(((r * (new - old) - r + 1) * seen["mask"]).sum() / seen["mask"].sum())

    assert row["kl_new_old"] == pytest.approx(kl(seen["new"], seen["rollout"]), rel=1e-4)
    assert row["kl_new_old/update"] == pytest.approx(kl(seen["new"], seen["before"]), rel=1e-4)
    assert row["kl_new_old"] != pytest.approx(row["kl_new_old/update"], rel=1e-3)


def test_collapse_stop_is_reported_in_training_steps():
    from lorarl.train import flags as flagmod

    mon = flagmod.monitor(SimpleNamespace(rows=[]), stop=True, updates_per_step=4)
    mon.on_log(None, SimpleNamespace(global_step=12), SimpleNamespace(should_training_stop=False))
    assert mon.stopped_at is None  # no flag yet
    flagmod_detect = flagmod.detect
    try:
        flagmod.detect = lambda rows: {"reward_collapse": 3}
        control = SimpleNamespace(should_training_stop=False)
        mon.on_log(None, SimpleNamespace(global_step=12), control)
    finally:
        flagmod.detect = flagmod_detect
    assert mon.stopped_at == 3 and control.should_training_stop  # update 12 ends training step 3
