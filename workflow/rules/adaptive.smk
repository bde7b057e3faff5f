# Adaptive studies (docs/adaptive.md): a study with a `search:` or `hypotheses:` block expands only what its
# decisions allow, through Snakemake's checkpoints. Per cell of a searched setting, training is cut into segments
# at the rungs: `train_rung` trains it up to a rung (its `--until`: checkpoint kept, nothing published, the
# rung mark its output), `evaluate_step` scores the rung's snapshot, and the checkpoint `decide_rung` decides the
# rung from those records (lorarl.pipeline.decisions.decide). Only then do the input functions (lorarl.adaptive.flow) ask
# for the next segment of the promoted cells; a stopped cell is asked for nothing more (censored at its rung).
# Hypotheses: the checkpoint `hypothesis_look` after each seed; an undecided comparison asks for the next seed's
# cells (lorarl.language.adaptive.seeds). `--config search=off`: no search (every cell to its end, resuming at its rung).
from pathlib import Path as _Path

from lorarl.pipeline.decisions.adaptive_flow import AdaptiveStudy, describe as _describe_adaptive, search_is_off
from lorarl.pipeline.decisions.adaptive_flow import existing_mark as _existing_mark, last_mark as _last_mark

SEARCH_ON = not search_is_off(config.get("search", "on"))
DECIDE = f"{sys.executable} -m lorarl.pipeline.decisions.decide"


def _rung_view(study, step, n):
    """A rung's decisions (the checkpoint's output); IncompleteCheckpointException until it ran."""
    ad = ADAPT[study]
    out = checkpoints.decide_rung.get(study=study, tag=ad.search_tag, step=str(step), n=str(n)).output[0]
    return json.loads(_Path(out).read_text())


def _look_view(study, name, n):
    ad = ADAPT[study]
    out = checkpoints.hypothesis_look.get(study=study, tag=ad.hyp_tag, hypothesis=name, n=str(n)).output[0]
    return json.loads(_Path(out).read_text())


def _adaptive_studies():
    out = {}
    for name, (_, s) in STUDIES.items():
        if name in CELL_STAGE_STUDIES and (s.search is not None or s.hypotheses):
            ad = AdaptiveStudy(s, TABLES[name], RESULTS, SEARCH_ON, _rung_view, _look_view)
            if ad.active:
                out[name] = ad
    return out


ADAPT = _adaptive_studies()  # study name -> lorarl.pipeline.decisions.adaptive_flow.AdaptiveStudy
OFF_SEARCH = {n: s for n, (_, s) in STUDIES.items() if s.search is not None and not SEARCH_ON}  # search=off
for _s, _ad in ADAPT.items():  # what is decided and what waits on a rung (a dry run prints it too)
    for _line in _describe_adaptive(_ad):
        print(f"[lorarl] {_s}: {_line}", file=sys.stderr)


def adaptive_train_input(wildcards):
    """`train` (to the end) of a searched cell: its last rung's mark, once promoted there. search=off: the mark of
    its last rung on disk (the same input, so switching the search off reruns no finished cell)."""
    ad = ADAPT.get(wildcards.study)
    if ad is not None and ad.search is not None:
        return [ancient(p) for p in ad.train_inputs(wildcards.cell)]
    if wildcards.study in OFF_SEARCH:
        mark = _last_mark(OFF_SEARCH[wildcards.study], TABLES[wildcards.study], RESULTS, wildcards.cell)
        return [ancient(mark)] if mark else []
    return []


def adaptive_step_eval_input(wildcards):
    """A snapshot evaluation of a searched cell: the mark of the segment that saved it (None: the default)."""
    ad = ADAPT.get(wildcards.study)
    if ad is not None and ad.search is not None:
        marks = ad.step_eval_inputs(wildcards.cell, int(wildcards.step))
        return None if marks is None else [ancient(m) for m in marks]
    if wildcards.study in OFF_SEARCH:  # search=off: a snapshot a rung job saved stays evaluated
        mark = _existing_mark(OFF_SEARCH[wildcards.study], TABLES[wildcards.study], RESULTS, wildcards.cell,
                              int(wildcards.step))
        return None if mark is None else [ancient(mark)]
    return None


def segment_input(wildcards):
    return [ancient(p) for p in ADAPT[wildcards.study].segment_inputs(wildcards.cell, int(wildcards.step))]


def view_input(wildcards):
    marks, evals = ADAPT[wildcards.study].view_inputs(int(wildcards.step), wildcards.n)
    return [ancient(p) for p in marks] + evals


def look_input(wildcards):
    return ADAPT[wildcards.study].look_inputs(wildcards.hypothesis, int(wildcards.n))


localrules:
    decide_rung,
    hypothesis_look,


rule train_rung:
    input:
        base_model_input,
        segment_input,
    output:
        paths.pattern("rung_mark", results=RESULTS),
    wildcard_constraints:
        study=_alternation([s for s, ad in ADAPT.items() if ad.search is not None]),
        step=r"\d+",
    params:
        stage="train",
        study=study_file,
        target=launch_target,
        config_hash=cell_hash,
        results=RESULTS,
        launcher=config["launcher"],
    priority: member_priority
    threads: 1
    retries: OOM_RETRIES
    resources:
        oom_attempt=oom_attempt,
    log:
        f"{RESULTS}/{{study}}/{{cell}}/logs/train@{{step}}.log",
    shell:
        launch("train", OOM_ATTEMPT + " --until={wildcards.step}")


checkpoint decide_rung:
    input:
        view_input,
    output:
        paths.pattern("rung_view", results=RESULTS),
    wildcard_constraints:
        study=_alternation(list(ADAPT)),
        tag=r"search-[0-9a-f]{10}",
        step=r"\d+",
        n=r"\d+|all",
    params:
        study=study_file,
        results=RESULTS,
    log:
        f"{RESULTS}/{{study}}/adaptive/{{tag}}/rung-{{step}}-{{n}}.log",
    shell:
        "{DECIDE} rung {params.study} --step {wildcards.step} --n {wildcards.n} --out {output} "
        "--results {params.results} --tracking {config[tracking]:q} "
        "--tracking-credentials={config[tracking_credentials]:q} > {log} 2>&1"


checkpoint hypothesis_look:
    input:
        look_input,
    output:
        paths.pattern("hypothesis_look", results=RESULTS),
    wildcard_constraints:
        study=_alternation(list(ADAPT)),
        tag=r"hyp-[0-9a-f]{10}",
        hypothesis=r"[A-Za-z0-9][A-Za-z0-9_-]*",
        n=r"\d+",
    params:
        study=study_file,
        results=RESULTS,
    log:
        f"{RESULTS}/{{study}}/adaptive/{{tag}}/{{hypothesis}}-{{n}}.log",
    shell:
        "{DECIDE} look {params.study} --hypothesis {wildcards.hypothesis} --n {wildcards.n} --out {output} "
        "--results {params.results} > {log} 2>&1"
