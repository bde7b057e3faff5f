"""Out of disk space while a stage writes its outputs: one clear error, finished cells untouched.

A stage's declared outputs are written into a temporary folder and moved in complete (summary.json,
the "done" mark, last), so a failed write never leaves a file Snakemake could take as an output, and
never touches another cell. `lorarl.pipeline.jobs.launch.run_stage` turns ENOSPC into `disk_full_error` (what could
not be written, the free space left, what to do) after removing the attempt's temporary folder.
Test hook: LORARL_FAULT=disk_full (lorarl.faulthooks) makes the write of a train cell's summary.json fail with
ENOSPC (lorarl.io.disk_full_hook, below the trainer).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lorarl.pipeline.jobs.stages import get_stage


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC, as an OSError or wrapped by a library (safetensors: "No space left on device (os error 28)")."""
    import errno

    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err) or "os error 28" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def free_partial_outputs(stage: str, study_path: str, cell: str, results_dir: str) -> None:
    """After a failed write: remove this attempt's temporary folder (the cell's declared outputs are
    only ever moved in complete, so nothing else of the cell, and nothing of other cells, is touched)."""
    scratch = get_stage(stage).scratch  # the stage registry's: where the stage writes before moving outputs in
    if not scratch:
        return
    try:
        from lorarl import paths
        from lorarl.language.study import load_study

        shutil.rmtree(paths.cell_dir(results_dir, load_study(study_path).name, cell) / scratch, ignore_errors=True)
    except Exception:  # noqa: BLE001 - best effort; the disk-full error is what gets reported
        pass


def disk_full_error(err: BaseException, stage: str, cell: str, results_dir: str) -> OSError:
    """One clear error for a full disk: what failed, how much space is left, what to do."""
    import errno

    try:
        space = f"{shutil.disk_usage(results_dir).free / 2**20:.1f} MiB free on {results_dir}"
    except OSError:
        space = f"free space on {results_dir} unknown"
    return OSError(errno.ENOSPC, f"out of disk space: the {stage} stage of cell {cell} could not write "
                                 f"{getattr(err, 'filename', None) or 'its outputs'} ({space}). Nothing of this cell was taken as "
                                 f"done and finished cells are untouched; free space, then rerun `snakemake all`")
