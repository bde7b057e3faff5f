# Train one cell: GRPO + adapter through the submitit launcher. The config hash is a param, so
# changing a setting reruns exactly the affected cells. A cell of an adaptive study's search trains here from its
# last rung on, once promoted there (workflow/rules/adaptive.smk).


rule train:
    input:
        base_model_input,
        adaptive_train_input,
    output:
        summary=paths.pattern("summary", results=RESULTS),
        metrics=paths.pattern("metrics", results=RESULTS),
        cell_json=paths.pattern("cell_json", results=RESULTS),
        adapter=directory(paths.pattern("adapter", results=RESULTS)),
    wildcard_constraints:
        study=GRPO_STUDIES,
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
        f"{RESULTS}/{{study}}/{{cell}}/logs/train.log",
    shell:
        launch("train", OOM_ATTEMPT)


def _rerun_for_incomplete_only(job):
    """Snakemake reruns ``job`` only because a killed run left its outputs marked incomplete: `rerun-incomplete`
    forces such a job as `--forcerun` would (reason "forced"), so what the user forced (--forceall, --forcerun of
    its rule or an output, -F on a target) tells them apart."""
    reasons = list(workflow.dag.reason(job).get_names())
    if reasons == ["incomplete output files"]:
        return True
    ds = workflow.dag_settings
    forced = {str(f) for f in ds.forcerun}
    by_user = (ds.forceall or (ds.forcetargets and job in workflow.dag.targetjobs) or job.rule.name in forced
               or any(str(f) in forced for f in job.output))
    return reasons == ["forced"] and not by_user


def keep_finished_aside():
    """`onstart` (nothing runs yet): a `train` job Snakemake reruns only because a killed run left its whole
    outputs marked incomplete (its job went on and finished) may put them back instead of retraining
    (lorarl.train.salvage.allow); a job rerun for any other reason (forced by the user, changed params) drops what
    was kept, so it retrains."""
    from lorarl.train.salvage import allow, describe, discard

    kept = []
    for job in workflow.dag.needrun_jobs():
        if job.rule.name == "train":
            s, c = job.wildcards_dict["study"], job.wildcards_dict["cell"]
            if not _rerun_for_incomplete_only(job):
                discard(RESULTS, s, c)
            elif allow(RESULTS, s, c, TABLES[s].cell(c).hash, INVOCATION):
                kept.append((s, c))
    for line in describe(kept):
        print(line, file=sys.stderr, flush=True)
