"""Step time without one-off costs (docs/report.md#step-time): a job's start-up (the grading workers it starts beside
its model load, an inference engine's construction) is recorded by lorarl.jobclock, never in a step's time. The
solo trainer's jobs, paused and resumed, are checked in tests/train/test_cell_pause.py (each job's first step at most twice
the cell's median step; `time/startup_s` on each job's first row); a pack's engine here."""

from __future__ import annotations

from lorarl import jobclock


def test_an_engine_built_for_a_pack_is_the_jobs_start_up(monkeypatch):
    """A pack's vLLM engine is built before its first step; its construction is recorded as the job's start-up."""
    import time
    from types import SimpleNamespace

    from lorarl.pack import vllm_rollouts

    def slow_llm(model, **kw):
        time.sleep(0.05)
        return SimpleNamespace(model=model)

    monkeypatch.setattr(jobclock, "_startup", {})
    monkeypatch.setattr(vllm_rollouts, "_ENGINE", {})
    api = SimpleNamespace(LLM=slow_llm)
    llm = vllm_rollouts.pack_engine(api, "m", {"max_loras": 1, "max_lora_rank": 8})
    first = jobclock.startup_s()
    assert llm.model == "m" and first["engine"] >= 0.05
    assert vllm_rollouts.pack_engine(api, "m", {"max_loras": 1, "max_lora_rank": 8}) is llm  # kept: no second start
    assert jobclock.startup_s() == first
