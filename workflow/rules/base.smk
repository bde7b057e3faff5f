# Build a tiny local base model (tokenizer trained locally + SFT warm start); no download.


rule base_model:
    input:
        parent_model_input,
    output:
        paths.pattern("base_model", results=RESULTS),
    params:
        stage="base",
        study="-",
        target=launch_target,
        recipe=recipe_param,
        results=RESULTS,
        launcher=config["launcher"],
    threads: 2
    log:
        f"{RESULTS}/models/.logs/{{name}}.log",
    shell:
        launch("base")
