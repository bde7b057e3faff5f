"""One job of the pack check: ``python -m lorarl.gpucheck.packjob pack|solo STUDY CELLS RESULTS THREADS``.

Prints one JSON line: wall seconds and the process's peak memory (GPU: max allocated; CPU: max RSS).
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main() -> None:
    kind, study_path, cells, results, threads = sys.argv[1:6]
    t0 = time.perf_counter()
    import torch

    from lorarl.language.study import cell_table, load_study

    st = load_study(study_path)
    table = cell_table(st)
    ids = cells.split(",")
    if kind == "pack":
        from lorarl.pack.run import train_pack

        train_pack(st.name, [table.cell(c) for c in ids], results, threads=int(threads), pack_id="pack-gpucheck")
    elif kind == "solo":
        from lorarl.memory.auto import resolve_job
        from lorarl.train.main import train_cell

        cell = table.cell(ids[0])
        train_cell(st.name, cell, results, threads=int(threads), config=resolve_job(cell.config, results_dir=results))
    else:
        raise SystemExit(f"packjob: kind {kind!r}; allowed: pack, solo")
    if torch.cuda.is_available():
        peak, mk = torch.cuda.max_memory_allocated() / 2**30, "GPU max allocated"
    else:
        peak, mk = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "CPU max RSS"
    print(json.dumps({"wall_s": time.perf_counter() - t0, "peak_gb": peak, "memory_kind": mk}))


if __name__ == "__main__":
    main()
