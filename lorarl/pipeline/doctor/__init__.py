"""`lorarl doctor`: the checks and smoke job (it registers its own stage), the clock, the job plan, its costs and the projection of a study's run."""
