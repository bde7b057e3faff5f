"""The ``doctor`` stage, registered by the doctor itself: `lorarl doctor` submits it through the launcher
(lorarl.pipeline.jobs.launch), whose job imports this module by the registry's record
(lorarl.pipeline.jobs.stages.stage_module); the launcher never imports the doctor."""

from __future__ import annotations

from pathlib import Path

from lorarl.pipeline.doctor.job import MEASURED, doctor_job
from lorarl.pipeline.jobs.jobparams import JobParams
from lorarl.pipeline.jobs.stages import Job, register_stage

NAME = "doctor"  # the stage's registry name: `lorarl doctor` launches it


def _outputs(results_dir: str, study: str | None, cell: str, params: JobParams) -> list[Path]:
    return [Path(results_dir) / MEASURED]  # the job's measurements (written even when a check fails)


@register_stage(NAME, "checks + a smoke run of one cell (lorarl doctor submits it)", launchable=False,
                outputs=_outputs, resources_key="train")
def _doctor(job: Job) -> dict:
    return doctor_job(job.study_path, job.cell().id, job.results_dir, threads=job.threads)
