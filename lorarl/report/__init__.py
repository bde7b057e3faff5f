"""The study report: the papers' headline figures (a registry, `lorarl.report.registry`), tables with
their uncertainty (`lorarl.report.tables`, `lorarl.report.stats`) and `results/<study>/report.html`.

`build` works on partial studies (what is done is shown; the rest appears in the status table) and
is called by the aggregate stage and by `lorarl report <study>`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["build"]

# The aggregate's own figures (lorarl/report/plots.py), by file-name prefix: their captions on the page.
AGGREGATE_FIGURES = {
    "train_reward": "Training reward vs step (rolling mean of 5), one line per group, band ± sd over seeds (clipped "
                    "to the reward's range where it is known).",
    "pass1_vs_rank_": "Held-out headline metric of one benchmark vs adapter rank, one line per setting of the other "
                      "axes (β, prompt, ...), ± sd over seeds; dashed = each base row (one per prompt).",
    "eval_curve_": "Held-out headline metric of one benchmark at the eval_every snapshots, band ± sd over seeds.",
    "diagnostics": "Weight-space diagnostics per group: spectral drift, largest principal angle, update "
                   "distribution p_i and its cumulative energy, subspace similarity (papers 003, 004).",
}


def caption(stem: str, data=None) -> str:
    """A figure's caption on the page; with the study's data, its study-dependent parts filled in."""
    from lorarl.report.registry import REGISTRY

    if stem in REGISTRY:
        return f"[{REGISTRY[stem].paper}] {REGISTRY[stem].caption_for(data)}"
    return next((c for prefix, c in AGGREGATE_FIGURES.items() if stem.startswith(prefix)), "")


def build(study_path: str | Path, results: str | Path = "results", price: float | None = None) -> dict[str, Path]:
    """Everything above; `price`: per GPU-hour, for the cost section and tables/cost.csv (None: hours only)."""
    from lorarl import paths
    from lorarl import status
    from lorarl.tracking import client as tracking
    from lorarl.io import atomic_write_text
    from lorarl.report import html, tables
    from lorarl.report.data import load
    from lorarl.report.envelope import capability_table
    from lorarl.report.figures import draw_all
    from lorarl.report.adaptive import hypotheses_frame, search_frame
    from lorarl.report.fig_kl import kl_delta_table
    from lorarl.report.masks import mask_tables
    from lorarl.report.masks import titles as mask_titles
    from lorarl.provenance import cell_code
    import pandas as pd
    from lorarl.language.study import load_study

    study = load_study(study_path)
    results = Path(results)
    data = load(study, results)
    tdir = paths.path("table_csv", results=results, study=study.name).parent
    fdir = paths.path("figures", results=results, study=study.name)
    tdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    st = tables.stats_table(data)
    md = tables.stats_markdown(data, st)
    out["stats_csv"], out["stats_md"] = tdir / "stats.csv", tdir / "stats.md"
    st.to_csv(out["stats_csv"], index=False)
    atomic_write_text(out["stats_md"], md)
    extra = {"runtime (paper 000 Table 2: step time × steps, KL monitors excluded)": ("runtime", tables.runtime_table),
             "capability envelope: student and teacher, before training (paper 001 Table 2)": ("capability", capability_table),
             "peak vs final (paper 001 Table 3)": ("peak_final", tables.peak_final_table),
             f"Avg over benchmarks (avg_mean): {tables.avg_label(study)} (avg_weights: the weights)":
                 ("avg", tables.avg_columns),
             "without vs with KL, Δ Average (paper 000 Tables 2-4)": ("kl_delta", kl_delta_table),
             "adaptive search: each setting's mean metric at every rung it reached, its state, the rungs where a tie "
             "was decided by the name's hash (hash_ties), and the cell-steps its cells got, added seeds included, "
             "against the same cells trained to the end (docs/adaptive.md)": ("search", search_frame),
             "hypotheses: decision, estimate [interval] at the deciding look, seeds used of the cap, cell-steps of the "
             "two settings against the fixed design at the cap, bad seeds (diverged, collapse flags) and the "
             "assumption each claim rests on (docs/adaptive.md)": ("hypotheses", hypotheses_frame)}
    shown = {}
    for title, (name, fn) in extra.items():
        df = fn(data)
        if not df.empty:
            out[name] = tdir / f"{name}.csv"
            df.to_csv(out[name], index=False)
            shown[title] = df
    masks = mask_tables(data)  # paper 004 Tables 4-5: at each snapshot step and the final one, with #params
    for name, title in mask_titles(data, masks).items():
        out[name] = tdir / f"{name}.csv"
        masks[name].to_csv(out[name], index=False)
        shown[title] = masks[name]
    if not data.base.empty:  # the untrained model, one row per model and prompt (lorarl.language.evalplan.bases)
        from lorarl.report.columns import headlines, primary_columns

        cols = primary_columns(data.base, headlines(study))
        base = data.base[["base"] + cols]
        title = "base model (untrained), one row per model and prompt"
        if len(cols) > 1:  # the Avg as the avg table takes it (paper 002 Table 3's Base row), labelled as there
            avg, how = tables.avg_series(data, data.base, cols)
            base = base.assign(avg=avg)
            title += f"; avg: {how}"
        shown[title] = base
    drawn, skipped = draw_all(data, fdir) if not data.cells.empty else ({}, {})

    out.update(drawn)
    pngs = sorted(fdir.glob("*.png")) if fdir.exists() else []
    figs = [(p, caption(p.stem, data)) for p in pngs]
    rows = status.study_status(str(study_path), results)
    prov = {"study file": str(study_path), "results": str(results.resolve()),
            "cells finished": f"{len(data.cells)} / {sum(r.kind == 'cell' for r in rows)}"}
    code = cell_code(results, study.name, [r.cell for r in rows if r.kind == "cell"], tracking.PACKAGES)
    out["provenance"] = tdir / "provenance.csv"  # the code each cell's jobs ran (lorarl.provenance.cell_code)
    pd.DataFrame(html.code_rows(code)).to_csv(out["provenance"], index=False)
    checkout = {**tracking.git_state(), **tracking.package_versions()}
    from lorarl.report import cost

    cost_csv, cost_df = cost.write(study, results, price)  # the jobs' cost records rolled up (lorarl.ledger)
    if cost_csv is not None:
        out["cost"] = cost_csv
    cost_html = cost.html_section(cost_df, cost.progress(study, results, cost_df) if not cost_df.empty else {}, price)
    page = html.page(study, results, rows, data.summaries, md, shown, figs, skipped, prov, code, checkout, cost_html)
    out["report"] = results / study.name / "report.html"
    atomic_write_text(out["report"], page)
    return out
