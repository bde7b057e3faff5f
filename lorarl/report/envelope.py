"""Paper 001 Table 2: the pre-training capability envelope of the student and the distillation teacher.

One table, one row per metric of each benchmark the teacher row is evaluated on
(``eval.teacher_benchmarks``): the sampled ``pass@k`` values (1, 4, 8 in the paper), the exploration
gap ``pass@4 - pass@1`` and the mean response length in tokens (the evaluation summary's
``mean_tokens``: every sample's completion tokens, averaged); one column per base row (the untrained
student rows, then the teacher row, :mod:`lorarl.language.evalplan.bases`) and, with one student row and one
teacher row, the paper's Δ column (teacher - student).
"""

from __future__ import annotations

import json
import re

import pandas as pd

from lorarl import paths
from lorarl.report.data import StudyData

PASS = re.compile(r"^(?P<bench>[A-Za-z0-9_]+)/pass@(?P<k>\d+)$")
GAP = ("pass@1", "pass@4")  # the paper's exploration gap: pass@4 - pass@1
LENGTH = "mean response length (tokens)"
DELTA = "Δ (teacher − student)"


def _mean_tokens(data: StudyData, cell: str, bench: str) -> float | None:
    p = paths.path("eval_summary", results=data.results, study=data.study.name, cell=cell, benchmark=bench)
    try:
        return float(json.loads(p.read_text())["mean_tokens"])
    except (OSError, KeyError, ValueError):
        return None


def _is_teacher(row: pd.Series) -> bool:
    return str(row.get("role", "")) == "teacher"


def capability_table(data: StudyData) -> pd.DataFrame:
    """Paper 001 Table 2 (see the module doc); empty without an evaluated teacher row."""
    base = data.base
    if base.empty or "role" not in base:
        return pd.DataFrame()
    teachers = [r for _, r in base.iterrows() if _is_teacher(r)]
    students = [r for _, r in base.iterrows() if not _is_teacher(r)]
    if not teachers:
        return pd.DataFrame()
    benches = list(dict.fromkeys(m.group("bench") for c in base.columns if (m := PASS.match(str(c)))
                                 and any(pd.notna(t.get(c)) for t in teachers)))
    rows_in = students + teachers
    labels = [f"{r['base']} ({'teacher' if _is_teacher(r) else 'student'})" for r in rows_in]
    out = []
    for bench in benches:
        ks = sorted({int(m.group("k")) for c in base.columns if (m := PASS.match(str(c))) and m.group("bench") == bench})
        metrics = {f"pass@{k}": [r.get(f"{bench}/pass@{k}") for r in rows_in] for k in ks}
        if all(f"{bench}/{m}" in base.columns for m in GAP):
            metrics[f"exploration gap ({GAP[1]} − {GAP[0]})"] = [
                r.get(f"{bench}/{GAP[1]}") - r.get(f"{bench}/{GAP[0]}") for r in rows_in]
        metrics[LENGTH] = [_mean_tokens(data, r["cell"], bench) for r in rows_in]
        for name, vals in metrics.items():
            row = {"benchmark": bench, "metric": name,
                   **{lab: (None if pd.isna(v) else float(v)) for lab, v in zip(labels, vals)}}
            if len(students) == 1 and len(teachers) == 1:
                s, t = row[labels[0]], row[labels[1]]
                row[DELTA] = None if s is None or t is None else t - s
            out.append(row)
    return pd.DataFrame(out)
