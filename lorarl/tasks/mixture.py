"""A dataset mixture (``task.sources``): each source's rows read with its own columns and unwrapping,
then drawn by count or weight and shuffled together, all with the data seed ``task.seed`` (shared by
every cell of a study, so all of them train on the same mixture; each cell's seed then orders it).

* by count: ``count`` rows of the source, drawn without repeats (``all`` = every row once; a count
  above the source's rows is an error naming the source and its size);
* by weight: ``task.mix_size`` rows (null = the sources' rows together) apportioned in proportion to
  the weights (largest remainders, ties to the earlier source); a source whose share exceeds its rows
  repeats whole as often as it fits, the rest drawn without repeats.
"""

from __future__ import annotations

import math
import random
import sys
from typing import Any, Callable

from lorarl.tasks.fields import describe_fields, field_value, missing_fields

Loader = Callable[..., list[dict]]  # lorarl.tasks.load_records


def source_records(src: Any, i: int, load: Loader) -> list[dict]:
    """The rows of ``task.sources[i]`` as {id, prompt, answer} (its columns, its unwrapping)."""
    rows = load(src.path, src.split, src.revision, src.config)
    if not rows:
        raise ValueError(f"task.sources[{i}] ({src.label()}) has no rows")
    missing = missing_fields(rows[0], [src.prompt_field, src.answer_field])
    if missing:
        raise ValueError(f"task.sources[{i}] ({src.label()}) lacks field(s) {missing}; has {describe_fields(rows[0])} "
                         f"(set task.sources[{i}].prompt_field / answer_field; a.b reads key b of column a, a list tries alternatives)")
    prompts = [str(field_value(r, src.prompt_field)) for r in rows]
    if src.unwrap:
        from lorarl.tasks.prompt import unwrap

        try:
            prompts = unwrap(src.unwrap, prompts)
        except ValueError as e:
            raise ValueError(f"task.sources[{i}] ({src.label()}): {e}") from None
    recs = [{"id": f"s{i}-{src.split}-{j}", "prompt": p, "answer": _gold(field_value(r, src.answer_field))}
            for j, (p, r) in enumerate(zip(prompts, rows))]
    kept = [r for r in recs if r["answer"]]
    if len(kept) < len(recs):  # e.g. SimpleRL-Zoo's level 3-5 file: two problems ship without a gold answer
        print(f"[lorarl] task.sources[{i}] ({src.label()}): {len(recs) - len(kept)} of {len(recs)} rows have no "
              "gold answer and are left out", file=sys.stderr)
    return kept


def _gold(value: Any) -> str:
    return "" if value is None else str(value).strip()


def apportion(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; ties to the earlier index)."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda k: (-(exact[k] - out[k]), k))
    for k in order[:total - sum(out)]:
        out[k] += 1
    return out


def draw(records: list[dict], n: int, rng: random.Random) -> list[dict]:
    """``n`` records: whole copies while they fit, the rest a draw without repeats."""
    copies, rest = divmod(n, len(records))
    return records * copies + rng.sample(records, rest)


def mixture_records(task: Any, load: Loader) -> list[dict]:
    """The training records of a mixture task, deterministic given ``task.seed`` and the sources."""
    per_source = [source_records(s, i, load) for i, s in enumerate(task.sources)]
    sizes = [len(r) for r in per_source]
    if task.sources[0].weight is not None:
        total = task.mix_size or sum(sizes)
        wanted = apportion(total, [s.weight for s in task.sources])
    else:
        wanted = [n if s.count == "all" else s.count for s, n in zip(task.sources, sizes)]
        for i, (s, want, n) in enumerate(zip(task.sources, wanted, sizes)):
            if want > n:
                raise ValueError(f"task.sources[{i}].count {want} exceeds the {n} rows of {s.label()}; allowed: "
                                 f"1..{n} or all (a weight repeats a small source)")
    out: list[dict] = []
    for i, (recs, want) in enumerate(zip(per_source, wanted)):
        out += draw(recs, want, random.Random(f"lorarl-mixture:{task.seed}:{i}"))
    random.Random(f"lorarl-mixture:{task.seed}").shuffle(out)
    return out
