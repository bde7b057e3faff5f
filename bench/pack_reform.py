"""What a resident job's re-form costs: building the next pack on the job's door (the base, KL reference, data and
regimes kept from the first pack, lorarl.pack.build.Door) against loading them again, side by side, one run.

    python bench/pack_reform.py                            # the tests' tiny model (hidden 32, 2 layers)
    python bench/pack_reform.py --hidden 1024 --layers 8   # the model of the H200 runs (bench/results/gpucheck-h200.md)

A resident job (lorarl.pack.resident) re-forms its pack each time a place frees while a cell waits: the members still
running pause, and the next pack is built from them and the next waiting cell. The cells are bench/resident_packs.py's
(LoRA r 2, K = ``--places``), with the KL monitor on (``kl_monitor_every: 2``: the pack holds a frozen reference).
Each repetition times, in alternation, ``build_pack(cells)`` (what a re-form cost before the door: the base loaded from
disk, its reference copied, the data prepared) and ``build_pack(cells, door=door)`` on a door opened by a first pack;
both packs then take one step and must produce the same rows. One torch thread; medians of ``--reps``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=32, help="model width")
    ap.add_argument("--layers", type=int, default=2, help="model depth")
    ap.add_argument("--places", type=int, default=4, help="K: cells of each pack")
    ap.add_argument("--reps", type=int, default=5, help="timed builds of each way (alternating)")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    import yaml

    import resident_packs as rb
    from lorarl.pack import build
    from lorarl.pack.build import Door

    rb.patch("lengths", 4)  # build.build_pack now grades outcome members by the bench's deterministic text score

    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    root = Path(tempfile.mkdtemp(prefix="pack-reform-"))
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    model = rb.save_tiny(root / "tiny", args.hidden, args.layers)
    study = rb.write_study(root, model, "lengths", 4, 4, args.places)
    doc = yaml.safe_load(study.read_text())
    doc["defaults"]["train"]["kl_monitor_every"] = 2  # a frozen KL reference in every pack, as the monitors need
    study.write_text(yaml.safe_dump(doc))
    cells = rb.study_cells(study)[: args.places]

    def step_rows(pack) -> dict:
        rows = pack.loop.step()
        return {c: {k: v for k, v in r.items() if not k.startswith(rb.NOISY)} for c, r in rows.items()}

    door = Door()
    first = build.build_pack(cells, results_dir=root, device=device, door=door)  # the job's first pack opens the door
    del first
    times: dict[str, list[float]] = {"load again": [], "door": []}
    same = True
    for _ in range(args.reps):
        for way in times:
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            pack = build.build_pack(cells, results_dir=root, device=device, door=door if way == "door" else None)
            if device == "cuda":
                torch.cuda.synchronize()
            times[way].append(time.perf_counter() - t)
            rows = step_rows(pack)
            if way == "load again":
                want = rows
            else:
                same = same and rows == want
            del pack
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "CPU",
           "model": {"hidden": args.hidden, "layers": args.layers,
                     "parameters": sum(p.numel() for p in door.base.parameters())},
           "places": args.places, "reps": args.reps, "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
           "median_s": {k: round(v, 4) for k, v in med.items()}, "door_over_load": round(med["door"] / med["load again"], 3),
           "base_loads": door.loads, "same_first_step": same}
    print(json.dumps(out, indent=1))
    print(f"re-form of a {args.places}-cell pack, {out['model']['parameters'] / 1e6:.1f}M-parameter base on "
          f"{out['device']}: {med['load again']:.3f} s loading again, {med['door']:.3f} s on the door "
          f"({out['door_over_load']:.2f}x); first steps equal: {same}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    if not same or door.loads != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
