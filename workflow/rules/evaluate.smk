# Held-out evaluation, one job per cell x benchmark (and x snapshot step with eval.eval_every) of a
# trained cell, and per benchmark of a study's `base` pseudo-cell. Every sample is kept
# (<cell>/eval/<benchmark>[@step].jsonl) next to its summary (.json); lorarl.evaluate.main runs it.

EVAL_LAUNCH = launch("evaluate", OOM_ATTEMPT + " --eval-target={params.eval_target:q}")


rule evaluate:
    input:
        eval_inputs,
    output:
        summary=paths.pattern("eval_summary", results=RESULTS),
        samples=paths.pattern("eval_samples", results=RESULTS),
    wildcard_constraints:
        study=GRPO_STUDIES,
    params:
        stage="evaluate",
        study=study_file,
        target=launch_target,
        eval_target=eval_target,
        config_hash=eval_hash,
        results=RESULTS,
        launcher=config["launcher"],
    threads: 1
    retries: OOM_RETRIES
    resources:
        oom_attempt=oom_attempt,
    log:
        f"{RESULTS}/{{study}}/{{cell}}/logs/evaluate-{{benchmark}}.log",
    shell:
        EVAL_LAUNCH


rule evaluate_step:
    input:
        eval_inputs,
    output:
        summary=paths.pattern("eval_step_summary", results=RESULTS),
        samples=paths.pattern("eval_step_samples", results=RESULTS),
    wildcard_constraints:
        study=GRPO_STUDIES,
        step=r"\d+",
    params:
        stage="evaluate",
        study=study_file,
        target=launch_target,
        eval_target=eval_target,
        config_hash=eval_hash,
        results=RESULTS,
        launcher=config["launcher"],
    threads: 1
    retries: OOM_RETRIES
    resources:
        oom_attempt=oom_attempt,
    log:
        f"{RESULTS}/{{study}}/{{cell}}/logs/evaluate-{{benchmark}}@{{step}}.log",
    shell:
        EVAL_LAUNCH
