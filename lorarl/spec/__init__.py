"""The study language: what a study YAML may say and what it resolves to.

Every module here is pure (pydantic and the registries below it; nothing trains, nothing is downloaded):

* config sections, all on one strict base (:mod:`lorarl.strict`, below every reader of a section: unknown fields
  are errors, a number is never a boolean): the cell (:mod:`lorarl.spec.config`), its task (:mod:`lorarl.spec.task`), prompt
  (:mod:`lorarl.spec.prompt`) and the toy stages (:mod:`lorarl.spec.toy`);
* the study (:mod:`lorarl.spec.study`), its matrix of cells (:mod:`lorarl.spec.matrix`), their signatures
  (:mod:`lorarl.spec.signature`, :mod:`lorarl.spec.reserved`), the YAML positions errors point at
  (:mod:`lorarl.spec.yamlpos`), the checks before anything runs (:mod:`lorarl.spec.preflight`,
  :mod:`lorarl.spec.hubcheck`), the cluster profiles (:mod:`lorarl.spec.profiles`), the cell kinds
  (:mod:`lorarl.spec.kinds`), the evaluation plan (:mod:`lorarl.spec.evalplan`) and the adaptive blocks'
  grammar with the cells and settings it names (:mod:`lorarl.spec.adaptive`).

The modules keep their own import layers (tests/project/test_structure.py: each is a room of its own); nothing is
re-exported here.
"""
