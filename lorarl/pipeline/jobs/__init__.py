"""Launching a stage's job: the stage registry, the submitit launcher, its executor and Slurm queries, job
parameters, in-flight checks, out-of-memory retries, a full disk, the training layout, rung jobs."""
