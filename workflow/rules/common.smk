# Load the studies through lorarl.language.study (the one source of cell ids) and expose input functions.
# Each study's cell table is built ONCE here (lorarl.language.study.cell_table); every input function and
# param below is a dictionary access into it, so planning stays linear in the number of cells.
import functools
import json
import os
import re
import socket
import sys
import time
import types

from snakemake.utils import validate

from lorarl import paths
from lorarl.language.kinds import get_kind
from lorarl.models import cell_models, parent_recipe, recipe_hash, recipe_name
from lorarl.pipeline.jobs.stages import get_stage, resources_keys
from lorarl.language.study import StudyError, cell_table, load_study_to_run
from lorarl.study_set import effective_file as _effective_study_file
from lorarl.language.evalplan import plan as eval_plan

validate(config, "../schemas/config.schema.yaml")

# This `snakemake` run, an argument of every job it submits (`--invocation`, recorded by lorarl.provenance) and of
# its aggregates: a study's last complete run is timed from it (study/last_run_wall_time_s, lorarl.pipeline.studyrun.study_span).
INVOCATION = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"

# Progress lines name each job's study and cell; a dry run's summary points at no hidden line (lorarl.pipeline.progress.snakelog)
from snakemake.logging import logger as _snakemake_logger
from lorarl.pipeline.progress.snakelog import install as _name_jobs


def _dryrun():
    return workflow.dryrun


_name_jobs(_snakemake_logger, workflow.output_settings.quiet if workflow.output_settings else None, _dryrun)

RESULTS = config["results"]


wildcard_constraints:
    study=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    cell=r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    name=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    benchmark=r"[A-Za-z0-9_]+",


def _load_studies(files):
    """Each study, validated, its hub models and datasets cached or reachable (unless the profile's `hub_check:
    false`). A bad study exits 2 here, as `lorarl cells` does, before any job runs or anything is written.
    `--config set=...` (lorarl.study_set): the file the jobs get is the study with those defaults overridden."""
    out = {}
    for f in files:
        try:
            f = str(_effective_study_file(f, config.get("set"), RESULTS))
            s = load_study_to_run(f, config.get("hub_check", True))
        except StudyError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        out[s.name] = (f, s)
    return out


STUDIES = _load_studies(config["studies"])
TABLES = {name: cell_table(s) for name, (_, s) in STUDIES.items()}  # study name -> its CellTable


def _alternation(names):
    """Regex matching these study names (never matches when there are none)."""
    names = [re.escape(n) for n in names]
    return "|".join(names) or "(?!)"


# Study kinds (lorarl.language.kinds) decide which rules apply: per-cell stages, or one batch job per study.
CELL_STAGE_STUDIES = [n for n, (_, s) in STUDIES.items() if get_kind(s.kind).cell_stages]
GRPO_STUDIES = _alternation(CELL_STAGE_STUDIES)  # train/evaluate/diagnose rules apply to these
TOY_STUDIES = [n for n, (_, s) in STUDIES.items() if get_kind(s.kind).batch_stage]  # one batch job each


def study_file(wildcards):
    return STUDIES[wildcards.study][0]


def study_cell(wildcards):
    return TABLES[wildcards.study].cell(wildcards.cell)


def cell_hash(wildcards):
    """Rerun trigger of train/diagnose: the cell's training signature (no evaluation-only settings,
    no runtime fields), so adding a benchmark or changing a protocol reruns evaluations only."""
    return study_cell(wildcards).hash


def base_model_input(wildcards):
    """The local models a cell needs: its base model and a distillation teacher, if local recipes."""
    names = [recipe_name(m) for m in cell_models(study_cell(wildcards).config)]
    return [paths.pattern("base_model", results=RESULTS, name=n) for n in dict.fromkeys(names) if n]


def slurm_json(stage):
    """submitit Slurm parameters of a stage, from the profile (never from a study)."""
    return json.dumps(config.get("slurm", {}).get(stage, {}))


# Runtime settings reach the command from config, not as params: params are a rerun trigger, this text is
# not, so switching the MLflow store (`tracking:`) or a stage's Slurm resources (`slurm:`: partition, time,
# the training layout) never reruns a finished cell (tests/project/test_pipeline.py).
SLURM_JSON = {key: slurm_json(key) for key in resources_keys()}


def launch(stage, job_args=""):
    """The `lorarl launch` command of a rule whose jobs get the profile's ``slurm.<key>`` resources, the stage's
    resources key (lorarl.pipeline.jobs.stages: a pack's jobs get train's). ``job_args``:
    the job's parameters as arguments (lorarl.pipeline.jobs.jobparams: ``--attempt``, ``--until``, ``--places``, ...),
    never environment variables."""
    return (
        "lorarl launch {params.stage} {params.study} {params.target} --results {params.results} "
        "--executor {params.launcher} --threads {threads} --slurm {SLURM_JSON[" + get_stage(stage).resources_key + "]:q} "
        "--tracking {config[tracking]:q} --tracking-credentials={config[tracking_credentials]:q} "
        "--invocation={INVOCATION:q} " + (job_args + " " if job_args else "") + "> {log} 2>&1"
    )


# Out of memory (lorarl.pipeline.jobs.oom): train, evaluate and train_pack jobs are retried OOM_RETRIES times; the
# attempt number reaches the job as its `--attempt` through a resource (not a param: never a rerun trigger),
# and each retry after an out-of-memory failure runs one rung down the memory ladder (lorarl.memory.ladder).
OOM_RETRIES = 3
OOM_ATTEMPT = "--attempt={resources.oom_attempt}"


def oom_attempt(wildcards, attempt):
    return attempt


# Job order among ready jobs (Snakemake's `priority:`; everything else 0): pack jobs first, then packed members'
# train / train_rung jobs (once their pack staged them, a publish of seconds; behind evaluations a member sat staged
# for minutes), then the rest. The values are the hosting plan's (lorarl.pack.hosting), the doctor's order too.
from lorarl.pack.hosting import MEMBER_PRIORITY, PACK_PRIORITY


def member_priority(wildcards):
    """A cell's train / train_rung job: MEMBER_PRIORITY when the hosting plan packs it (HOSTS, workflow/rules/pack.smk:
    empty with packing off), else 0."""
    host = HOSTS.get(wildcards.study, {}).get(wildcards.cell)
    return MEMBER_PRIORITY if host is not None and host.packed else 0


def parent_model_input(wildcards):
    """A recipe that continues another's SFT (`init_from`) needs that model built first."""
    parent = parent_recipe(wildcards.name)
    return [paths.pattern("base_model", results=RESULTS, name=parent)] if parent else []


def recipe_param(wildcards):
    """The base rule reruns when its recipe changes (a param, like the cell config hash)."""
    return recipe_hash(wildcards.name)


def launch_target(wildcards):
    """What `lorarl launch` runs: a cell id, or a local model recipe for the base rule."""
    return wildcards.cell if "cell" in wildcards.keys() else wildcards.name


def eval_inputs(wildcards):
    """A trained cell needs its adapter (its snapshots are written by the same training job); a base
    pseudo-cell needs only the base model."""
    if _is_base(wildcards):
        return base_model_input(wildcards)
    if "step" in wildcards.keys():  # an adaptive study's snapshot: the rung job that saved it (adaptive.smk)
        marks = adaptive_step_eval_input(wildcards)
        if marks is not None:
            return marks
    kw = dict(results=RESULTS, study=wildcards.study, cell=wildcards.cell)
    return [paths.path("summary", **kw), paths.path("adapter", **kw)]


def _is_base(wildcards):
    return TABLES[wildcards.study].is_base(wildcards.cell)


def eval_hash(wildcards):
    """Rerun trigger of one evaluation: weights, benchmark source, resolved protocol, backend."""
    step = int(wildcards.step) if "step" in wildcards.keys() else None
    return TABLES[wildcards.study].eval_signature(wildcards.cell, wildcards.benchmark, step)


def eval_target(wildcards):
    """`--eval-target` of an evaluate job: `<benchmark>` or `<benchmark>@<step>`."""
    step = int(wildcards.step) if "step" in wildcards.keys() else None
    return eval_plan.format_target(wildcards.benchmark, step)


def eval_outputs(s, cell, is_base):
    """Summary files of every evaluation of a cell: each benchmark, and each snapshot step."""
    cfg = TABLES[s].cell(cell).config
    try:
        targets = eval_plan.eval_targets(cfg, is_base)
    except eval_plan.EvalPlanError as err:
        raise WorkflowError(f"study {s}, cell {cell}: {err}")
    kw = dict(results=RESULTS, study=s, cell=cell)
    return [paths.path("eval_summary", benchmark=b, **kw) if step is None
            else paths.path("eval_step_summary", benchmark=b, step=step, **kw) for b, step in targets]


def aggregate_inputs(wildcards):
    s = wildcards.study
    if s in ADAPT:  # as far as the decisions go (lorarl.pipeline.decisions.adaptive_flow), and the base pseudo-cells
        bases = [str(p) for b in base_ids(s) for p in eval_outputs(s, b, True)]
        return ADAPT[s].aggregate_inputs(functools.partial(cell_outputs, s)) + bases
    return study_outputs(s)


def cell_outputs(s, cell):
    """What the aggregate reads of one trained cell: its diagnostics, evaluations and summary."""
    kw = dict(results=RESULTS, study=s, cell=cell)
    return [str(paths.path("diagnostics", **kw))] + [str(p) for p in eval_outputs(s, cell, False)] + \
        [str(paths.path("summary", **kw))]


_OUTPUTS = {}  # study name -> its per-cell files (computed once)


def study_outputs(s):
    """Per-cell files of a study that the aggregate reads."""
    if s not in _OUTPUTS:
        _OUTPUTS[s] = _study_outputs(s)
    return _OUTPUTS[s]


def _study_outputs(s):
    if s in TOY_STUDIES:
        return [paths.path("summary", results=RESULTS, study=s, cell=c) for c in cell_ids(s)]
    diags = [paths.path("diagnostics", results=RESULTS, study=s, cell=c) for c in cell_ids(s)]
    return diags + _eval_and_train_outputs(s)


def _eval_and_train_outputs(s):
    cells = cell_ids(s) + base_ids(s)
    bases = set(base_ids(s))
    evals = [p for c in cells for p in eval_outputs(s, c, c in bases)]
    trains = [paths.path("summary", results=RESULTS, study=s, cell=c) for c in cell_ids(s)]
    return evals + trains


def cell_ids(study):
    return TABLES[study].ids


def base_ids(study):
    return TABLES[study].base_ids


def adaptive_pending(wildcards):
    """`rule all`, beside all_targets: an adaptive study's files as far as its decisions go (what its aggregate
    reads), for a study whose tables exist from an earlier run. A pending decision there (a checkpoint not run yet,
    e.g. a hypothesis's look once `--config search=off` trains the cells the search stopped) is then planned:
    asked only by an aggregate whose outputs exist, Snakemake plans nothing."""
    out = []
    for s in ADAPT:
        if os.path.exists(paths.path("table_md", results=RESULTS, study=s)):
            out += aggregate_inputs(types.SimpleNamespace(study=s))
    return list(dict.fromkeys(out))


def all_targets():
    """Every study's tables plus every cell's outputs: deleting a cell's files reruns that cell."""
    out = []
    for s in STUDIES:
        out += [paths.pattern("table_md", results=RESULTS, study=s)]
        if s not in ADAPT:
            out += [str(p) for p in study_outputs(s)]
        else:  # an adaptive study's cells: what its aggregate asks for, as decided (adaptive.smk); its bases now
            out += [str(p) for b in base_ids(s) for p in eval_outputs(s, b, True)]
    return out


def print_failures():
    """`onerror`: the default profile is quiet about rules, so list every failed stage here."""
    from lorarl.pipeline.progress.watch import failure_lines

    stop_progress()
    for name, (f, s) in STUDIES.items():
        if not get_kind(s.kind).cell_stages:
            continue
        for line in failure_lines(f, RESULTS):
            print(f"[lorarl] {name}: {line}", file=sys.stderr)
        print(f"[lorarl] {name}: details with `lorarl status {f}`", file=sys.stderr)


# The console of plain `snakemake all` (lorarl.pipeline.progress.console): each study's progress every `progress_every`
# seconds and each local base model's build while it runs (`onstart`), where the outputs are (`onsuccess`).
_PROGRESS = []


def start_progress():
    """`onstart`: the progress lines' thread (none with `progress_every: 0`); display only, no job waits on it."""
    from lorarl.models import study_recipes
    from lorarl.pipeline.progress.console import Progress
    from lorarl.language.study import study_cells

    every = float(config.get("progress_every", 60) or 0)
    grpo = [(f, s) for f, s in STUDIES.values() if get_kind(s.kind).cell_stages]
    if every <= 0 or not grpo:
        return
    recipes = [r for _, s in grpo for r in study_recipes(study_cells(s))]
    _PROGRESS.append(Progress([f for f, _ in grpo], RESULTS, every, recipes).start())


def stop_progress():
    """`onsuccess` and `onerror`: no progress line after Snakemake's last ones."""
    while _PROGRESS:
        _PROGRESS.pop().stop()


def print_outputs():
    """`onsuccess`: each study's report.html, tables and figures."""
    from lorarl.pipeline.progress.console import output_lines

    stop_progress()
    for line in output_lines(list(STUDIES), RESULTS):
        print(line, flush=True)
