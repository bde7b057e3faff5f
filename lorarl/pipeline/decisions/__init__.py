"""An adaptive study's decisions in the workflow: the rung and look jobs and the flow Snakemake asks."""
