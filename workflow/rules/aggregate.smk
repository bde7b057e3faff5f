# Tables (mean ± sd over seeds) and figures from the per-cell files; always runs locally.


localrules:
    aggregate,


rule aggregate:
    input:
        aggregate_inputs,
    output:
        md=paths.pattern("table_md", results=RESULTS),
        csv=paths.pattern("table_csv", results=RESULTS),
    params:
        study=study_file,
        results=RESULTS,
    log:
        f"{RESULTS}/{{study}}/tables/aggregate.log",
    # the profile's store and UI, only for report.html's MLflow links (config in the command, not a param: no rerun)
    shell:
        "lorarl aggregate {params.study} --results {params.results} --tracking {config[tracking]:q} "
        "--tracking-credentials={config[tracking_credentials]:q} --mlflow-ui={config[mlflow_ui]:q} "
        "--gpu-hour-price={config[gpu_hour_price]:q} --invocation={INVOCATION:q} > {log} 2>&1"
