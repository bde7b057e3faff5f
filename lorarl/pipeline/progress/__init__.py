"""Watching a running study: `lorarl status --watch`, the console lines, the ETA, Snakemake's job names."""
