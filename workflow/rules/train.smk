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
    threads: 1
    retries: OOM_RETRIES
    resources:
        oom_attempt=oom_attempt,
    log:
        f"{RESULTS}/{{study}}/{{cell}}/logs/train.log",
    shell:
        launch("train", OOM_ATTEMPT)


def keep_finished_aside():
    """`onstart` (nothing runs yet): a `train` job Snakemake reruns only because a killed run left its outputs
    marked incomplete, whose outputs are whole (its job went on and finished), gets them kept aside and put back
    by the job instead of a retrain (lorarl.train.salvage); a job rerun for any other reason (forced, changed
    params or code) drops what an earlier run kept."""
    from lorarl.train.salvage import describe, keep_aside_for

    kept = []
    for job in workflow.dag.needrun_jobs():
        if job.rule.name == "train":
            s, c = job.wildcards_dict["study"], job.wildcards_dict["cell"]
            reasons = list(workflow.dag.reason(job).get_names())
            if keep_aside_for(reasons, RESULTS, s, c, TABLES[s].cell(c).hash):
                kept.append((s, c))
    for line in describe(kept):
        print(line, file=sys.stderr, flush=True)
