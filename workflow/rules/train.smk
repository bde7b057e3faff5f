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
