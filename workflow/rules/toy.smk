# Studies whose kind runs one batch job (lorarl.language.kinds batch_stage; today the toy kl_bound_toy): one
# job runs every cell (each costs ~0.1 s, a Python start-up per cell would cost 100x more) and writes
# one folder and one MLflow run per cell.

for _toy in TOY_STUDIES:

    rule:
        name:
            f"toy_{_toy}"
        output:
            [paths.path("summary", results=RESULTS, study=_toy, cell=c) for c in cell_ids(_toy)],
        params:
            stage=get_kind(STUDIES[_toy][1].kind).batch_stage,
            study=STUDIES[_toy][0],
            target="all",
            hashes=",".join(c.hash for c in TABLES[_toy].cells),
            results=RESULTS,
            launcher=config["launcher"],
        threads: 1
        log:
            f"{RESULTS}/{_toy}/.toy/run.log",
        shell:
            launch("toy")
