"""An adaptive study's search, drawn (docs/adaptive.md): each setting's metric per rung, kept and stopped marked.

The values are the ledger's (``results/<study>/adaptive/search.json``): at each rung, the mean over the
setting's paired cells (its seeds) of the rung metric, the number the search ranked; the last point of a
setting that went through every rung is its final held-out metric at the last step, the mean over the same cells
(the same seeds) as its rung points: a seed a hypothesis added later is not in the line, so no point of it
averages other seeds than the others. Drawn only once every one of those cells finished.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lorarl.report import draw
from lorarl.report.adaptive import rung_values
from lorarl.report.data import StudyData
from lorarl.report.registry import register

MARKS = {"promote": ("o", "kept (promoted)"), "stop": ("X", "stopped (censored)"), "fail": ("x", "failed"),
         "waiting": ("s", "waiting for the rung's decision")}


def _final(data: StudyData, metric: str, cells: list[str]) -> float | None:
    """A finished setting's final metric: the mean over ``cells`` (the ones its rung values average), once every
    one of them has it (lorarl.report.data.StudyData.cells)."""
    c = data.cells
    if c.empty or metric not in c:
        return None
    vals = c.set_index("cell")[metric].reindex(cells)
    return float(vals.mean()) if vals.notna().all() else None


@register("search_rungs", "adaptive", ("search",),
          "The search of an adaptive study: each setting's rung metric (the mean over its seeds, what the search "
          "ranked) at every rung it reached, one line per setting; o = kept (promoted), X = stopped there "
          "(censored: never trained further), x = failed; a kept setting's line ends at its final held-out "
          "metric at the last step. Decisions and values from results/<study>/adaptive/search.json.")
def search_rungs(data: StudyData, out: Path) -> Path | None:
    led = data.search
    long = rung_values(led)
    if long.empty:
        return None
    metric = led["rule"]["metric"]
    finals = []
    for name, st in led["state"].items():
        if st["state"] == "finishing":
            v = _final(data, metric, led["settings"][name]["cells"])
            if v is not None:
                finals.append({"setting": name, **led["settings"][name]["labels"], "step": _last_step(data),
                               "value": v, "decision": "final"})
    table = pd.concat([long, pd.DataFrame(finals)], ignore_index=True)
    plt = draw.plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for name in dict.fromkeys(table["setting"]):
        g = table[table["setting"] == name].sort_values("step")
        color = draw.color_of(name)
        ax.plot(g["step"], g["value"], color=color, lw=1.4, label=name)
        for _, r in g.iterrows():
            if r["decision"] in MARKS and pd.notna(r["value"]):
                ax.plot(r["step"], r["value"], marker=MARKS[r["decision"]][0], color=color, ls="none",
                        ms=8 if r["decision"] == "stop" else 6)
    for what, (m, label) in MARKS.items():
        if (table["decision"] == what).any():
            ax.plot([], [], marker=m, color="0.3", ls="none", label=label)
    for step in sorted(set(long["step"])):
        ax.axvline(step, color="0.85", lw=0.8, zorder=0)
    ax.set_xlabel("training step (rungs: grey lines)")
    ax.set_ylabel(f"{metric} (mean over {', '.join(led['rule'].get('paired') or ['seeds'])})")
    ax.set_title(f"{data.study.name}: search {led['rule']['rule']}, eta {led['rule']['eta']}")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    return draw.save(fig, out, table)


def _last_step(data: StudyData) -> int:
    from lorarl.language.study import study_cells

    return max(c.config.train.steps for c in study_cells(data.study))
