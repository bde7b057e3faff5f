"""`lorarl doctor`: the checks and smoke job (job; it registers its own stage: stage), the clock, the study's
job plan (jobs), their costs, packs and the projection of the study's run, and the report."""
