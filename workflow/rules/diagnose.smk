# Weight-space diagnostics of a trained cell (original W0 vs effective W+): diagnostics.parquet.


rule diagnose:
    input:
        summary=paths.pattern("summary", results=RESULTS),
        adapter=paths.pattern("adapter", results=RESULTS),
    output:
        paths.pattern("diagnostics", results=RESULTS),
    wildcard_constraints:
        study=GRPO_STUDIES,
    params:
        stage="diagnose",
        study=study_file,
        target=launch_target,
        config_hash=cell_hash,
        results=RESULTS,
        launcher=config["launcher"],
    threads: 1
    log:
        f"{RESULTS}/{{study}}/{{cell}}/logs/diagnose.log",
    shell:
        launch("diagnose")
