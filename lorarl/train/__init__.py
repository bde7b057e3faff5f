"""Training stage: `main.train_cell` (one cell), the GRPO trainer, its callbacks, checkpoints and monitors."""
