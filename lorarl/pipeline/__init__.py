"""Running studies, one sub-package per concern: jobs (launching), doctor, progress (watching), studyrun (the
study's MLflow run), drills (fault drills), decisions (an adaptive study's)."""
