"""`results/<study>/report.html`: one self-contained page (figures as data URIs, inline CSS, no
script, nothing fetched): status matrix, tables with intervals, every figure, flags, MLflow links,
provenance."""

from __future__ import annotations

import base64
import datetime as dt
import html
from pathlib import Path

import pandas as pd

from lorarl.report.columns import baseline_text
from lorarl.report.mlflow_links import experiment_url, run_url, ui_target

CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#f3f3f3}.done{background:#e3f6e3}.failed{background:#fbe0e0}.running{background:#e3ecfb}
.diverged{background:#fdf0d5}.queued,.interrupted,.not-started{background:#f5f5f5}
.stopped{background:#ece6f6}.at-rung{background:#e3ecfb}.mixed{background:#fbe0e0}
figure{display:inline-block;margin:0 1em 1.5em 0;max-width:100%}figure img{max-width:100%}
figcaption{font-size:12px;max-width:900px}code{font-size:12px}"""


def _e(x) -> str:
    return html.escape("" if x is None or (isinstance(x, float) and x != x) else str(x))


def run_link(target: dict, run_id: str | None) -> str:
    if not run_id:
        return ""
    return f'<a href="{_e(run_url(target, run_id))}">{_e(run_id[:8])}</a>'


def mlflow_line(target: dict, study: str) -> str:
    """Where the runs are browsable: the store's UI (lorarl.report.mlflow_links), and how it was found."""
    exp = experiment_url(target)
    base = _e(target["base"])  # a link only while there is no experiment: the UI's home opens it on GenAI (#24498)
    where = (f'<a href="{_e(exp)}">experiment {_e(study)}</a> at {base}' if exp
             else f'experiment {_e(study)} at <a href="{base}">{base}</a>')
    hint = f"; {_e(target['hint'])}" if target.get("hint") else ""
    return f"<p>MLflow: {where} (from {_e(target['source'])}){hint}</p>"


def _table(df: pd.DataFrame) -> str:
    if df is None or df.empty:
        return "<p><i>nothing yet</i></p>"
    return df.to_html(index=False, na_rep="–", float_format=lambda v: f"{v:.4g}", border=0, escape=True)


def status_section(status_rows, summaries: dict, target: dict) -> str:
    counts: dict[str, int] = {}
    out = ["<table><tr><th>cell</th><th>state</th><th>step</th><th>evaluate</th><th>flags</th>"
           "<th>MLflow</th><th>detail</th></tr>"]
    for r in status_rows:
        if r.kind != "cell":
            continue
        s = summaries.get(r.cell, {})
        state = s.get("state", r.train.state) if r.train.state == "done" else r.train.state
        counts[state] = counts.get(state, 0) + 1
        detail = "; ".join(x for x in (r.train.detail, s.get("diverged_reason") or s.get("reason") or "",
                                       ("eval: " + r.evaluate.detail) if r.evaluate.detail else "") if x)
        flags = ", ".join(f"{k}@{v}" for k, v in (s.get("flags") or {}).items())
        if s.get("stopped_on_collapse"):
            flags += f" (stopped at {s['stopped_on_collapse']})"
        out.append(f'<tr class="{_e(state.replace(" ", "-"))}"><td>{_e(r.cell)}</td><td>{_e(state)}</td>'
                   f"<td>{_e(r.train.step)}</td><td>{_e(r.evaluate.state)}</td><td>{_e(flags)}</td>"
                   f"<td>{run_link(target, s.get('mlflow_run_id'))}</td><td>{_e(detail)}</td></tr>")
    out.append("</table>")
    head = "<p>" + ", ".join(f"<b>{n}</b> {_e(k)}" for k, n in sorted(counts.items())) + "</p>"
    return head + "".join(out)


def figure_html(png: Path, caption: str) -> str:
    b64 = base64.b64encode(png.read_bytes()).decode()
    return (f'<figure><img alt="{_e(png.stem)}" src="data:image/png;base64,{b64}">'
            f"<figcaption><b>{_e(png.stem)}</b>: {_e(caption)} (data: <code>{_e(png.with_suffix('.csv').name)}"
            "</code>)</figcaption></figure>")


def page(study, results: Path, status_rows, summaries: dict, stats_md: str, tables: dict[str, pd.DataFrame],
         figures: list[tuple[Path, str]], skipped: dict[str, list[str]], provenance: dict[str, str],
         code: dict[str, list[dict]] | None = None, checkout: dict[str, str] | None = None,
         cost: str = "") -> str:
    target = ui_target(results, study.name)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(study.name)} report</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>{_e(study.name)}</h1><p>generated {now}; axes: "
             + ", ".join(f"{_e(a)} ({len(ax.values)})" for a, ax in study.axes.items())
             + (f"; baseline: {_e(baseline_text(study.baseline))}" if study.baseline else "") + "</p>",
             mlflow_line(target, study.name),
             "<h2>Cells</h2>", status_section(status_rows, summaries, target),
             "<h2>Headline metrics with uncertainty</h2>", _md_table(stats_md)]
    for name, df in tables.items():
        parts += [f"<h3>{_e(name)}</h3>", _table(df)]
    parts.append("<h2>Figures</h2>")
    parts += [figure_html(p, c) for p, c in figures] or ["<p><i>no figure yet</i></p>"]
    if skipped:
        parts.append("<p>Not drawn (the study lacks what they need): " + "; ".join(
            f"{_e(k)} ({_e(', '.join(v))})" for k, v in skipped.items()) + "</p>")
    parts += ['<h2 id="cost">Cost</h2>', cost or "<p><i>no cost section</i></p>"]
    parts += ["<h2>Provenance</h2>", code_section(code or {}), "<table>"] + [
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in provenance.items()] + ["</table>"]
    parts += ["<h3>The checkout at report time</h3><p>Where this page was built from, not what the cells ran.</p>"
              "<table>"] + [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in (checkout or {}).items()]
    parts.append("</table></body></html>")
    return "\n".join(parts)


def code_rows(code: dict[str, list[dict]]) -> list[dict]:
    """One row per cell and code state its jobs ran (lorarl.provenance.cell_code); a cell without a record, one row
    saying so. Also `tables/provenance.csv` (`/` names: no axis can take them, lorarl.language.reserved)."""
    rows = []
    for cell, states in code.items():
        for s in states or [None]:
            rows.append({"cell": cell, "code/stages": ", ".join(s["stages"]) if s else "no job record",
                         "code/commit": s["sha"] if s else None, "code/dirty": s["dirty"] if s else None,
                         "code/diff_hash": s["diff_hash"] if s else None,
                         **({f"version/{p}": v for p, v in s["packages"].items()} if s else {})})
    return rows


def code_section(code: dict[str, list[dict]]) -> str:
    """The code each cell's jobs ran, from their own provenance records; flagged when the cells ran different code."""
    from lorarl.provenance import distinct_states

    states = distinct_states(code)
    if len(states) > 1:
        ran = ", ".join(f"{str(s['sha'])[:10]}{' dirty ' + str(s['diff_hash']) if s['dirty'] else ''}" for s in states)
        head = (f'<p class="mixed"><b>The cells ran different code</b>: {len(states)} code states ({_e(ran)}); '
                "compare cells only within one state.</p>")
    elif states:
        head = "<p>Every cell's jobs ran the same code (one code state).</p>"
    else:
        head = "<p><i>no job provenance record yet</i></p>"
    return (head + "<p>The code each cell's jobs ran (their provenance records, <code>&lt;cell&gt;/provenance/"
            "</code>):</p>" + _table(pd.DataFrame(code_rows(code))) if code else head)


def _md_table(md: str) -> str:
    """The stats markdown (caption paragraph + pipe table) as HTML."""
    lines = [ln for ln in md.splitlines() if ln.strip()]
    caption = [ln for ln in lines if not ln.startswith("|") and not ln.startswith("#")]
    rows = [ln.strip("|").split("|") for ln in lines if ln.startswith("|") and not ln.startswith("|---")]
    out = [f"<p>{_e(c)}</p>" for c in caption]
    if rows:
        out.append("<table><tr>" + "".join(f"<th>{_e(c.strip())}</th>" for c in rows[0]) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{_e(c.strip())}</td>" for c in r) + "</tr>" for r in rows[1:]]
        out.append("</table>")
    return "".join(out)
