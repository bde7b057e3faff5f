"""A cell's evaluation plan, resolved from its config: which benchmarks, protocols, snapshot steps and
grading settings (:mod:`.plan`, with the evaluation's rerun signature) and the base pseudo-cells, the
untrained model once per model and prompt (:mod:`.bases`). Read by the study's cell table
(lorarl.language.matrix), the train and evaluate stages, diagnose, report and the launcher; above lorarl.language.config and
lorarl.grading, below every stage."""
