"""The study's MLflow run: its tags, span and numbers, synced from the results."""
