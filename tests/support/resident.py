"""Resident packs: cells with rungs, the published outputs, solo reference runs and their comparison."""

from __future__ import annotations

import pandas as pd

from tests.support.study import IN_PROCESS, IN_PROCESS_TRAIN, tiny_study, write_study


def resident_cells(tmp_path, tiny_dir, steps=(2, 4), collapse=(False, True), **train):
    from lorarl.language.study import cell_table, load_study

    doc = tiny_study("rz", model=str(tiny_dir), **IN_PROCESS, eval=None,
                     train={**IN_PROCESS_TRAIN, "checkpoint_every": 0, "kl_monitor_every": 2, **train},
                     axes={"length": {"field": "train.steps", "prefix": "s", "values": list(steps)},
                           "stop": {"field": "train.stop_on_collapse", "prefix": "c", "values": list(collapse)}})
    p = write_study(tmp_path / "rz.yaml", doc)
    return {c.id: c for c in cell_table(load_study(str(p))).cells}


def assert_equal_runs(got, want, resumed_from, steps):
    """A cell's outputs equal its solo run's: adapter and metrics to 1e-6, every step once, its resumes."""
    (w, m, s), (w0, m0, s0) = got, want
    assert w.keys() == w0.keys() and max(float((w[k] - w0[k]).abs().max()) for k in w) <= 1e-6
    assert any(float(w0[k].abs().max()) > 0 for k in w0 if "lora_B" in k)  # it trained
    assert list(m.columns) == list(m0.columns) and list(m["step"]) == list(range(1, steps + 1))
    pd.testing.assert_frame_equal(m, m0, rtol=0, atol=1e-6)
    assert (resumed_from is None or s["resumed_from_steps"] == resumed_from) and s["state"] == s0["state"] == "done"
    assert s["steps"] == s0["steps"] == steps and s.get("stopped_on_collapse") == s0.get("stopped_on_collapse")


def published(res, cells):
    from lorarl.pack import publish

    for c in cells:
        assert publish.publish(res, "rz", c.id, c.hash), c.id  # its own train job moves the staged outputs in place


def solo_runs(ref, cells):
    from lorarl.pack.run import train_alone

    return {c.id: train_alone("rz", c, ref) for c in cells}
