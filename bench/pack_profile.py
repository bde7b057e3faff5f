"""Where a pack step's time goes: cProfile of a pack of 1 and a pack of K cells on this machine's device.

    python bench/pack_profile.py                          # the tests' tiny model (hidden 32, 2 layers)
    python bench/pack_profile.py --hidden 1024 --layers 8 # the model of the H200 profile (bench/results/gpucheck-h200.md)
    LORARL_PACK_GROUPED=1 python bench/pack_profile.py    # grouped adapter terms (lorarl.pack.routing); 0: one cell at a time

The cells are bench/resident_packs.py's (LoRA r 2, P = 2 x G = 2, 8 completion tokens, rewards a deterministic score
of the text); a warm-up pack of one first, then a pack of 1 and a pack of K, ``--steps`` each, one torch thread.
Printed per pack: its wall time, the functions with the most time of their own, and lorarl's functions by time
including callees.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path


def report(prof: cProfile.Profile, rows: int) -> str:
    out = []
    for key, pattern in (("tottime", None), ("cumulative", "lorarl")):
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats(key)
        st.print_stats(*([pattern, rows] if pattern else [rows]))
        out.append("\n".join(line for line in s.getvalue().splitlines() if line.strip()))
    return "\n\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=32, help="model width")
    ap.add_argument("--layers", type=int, default=2, help="model depth")
    ap.add_argument("--places", type=int, default=4, help="K: cells of the second pack")
    ap.add_argument("--steps", type=int, default=10, help="steps of each pack")
    ap.add_argument("--rows", type=int, default=25, help="lines of each profile table")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    import resident_packs as rb
    from lorarl.pack.run import train_pack

    torch.set_num_threads(1)
    rb.patch("lengths", args.steps)
    root = Path(tempfile.mkdtemp(prefix="pack-profile-"))
    atexit.register(shutil.rmtree, root, True)  # the temporary folder goes when the bench ends
    model = rb.save_tiny(root / "tiny", args.hidden, args.layers)
    study = rb.write_study(root, model, "lengths", args.steps, args.steps, max(args.places, 1))
    cells = [c for c in rb.study_cells(study) if c.config.train.steps == args.steps][: args.places]
    train_pack("rb", cells[:1], root / "warm", threads=1, pack_id="warm")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    for K in sorted({1, len(cells)}):
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        train_pack("rb", cells[:K], root / f"k{K}", threads=1, pack_id=f"k{K}")
        prof.disable()
        print(f"=== {device}: pack of {K}, {args.steps} steps, hidden {args.hidden} x {args.layers} layers: "
              f"{time.perf_counter() - t:.2f} s")
        print(report(prof, args.rows))


if __name__ == "__main__":
    main()
