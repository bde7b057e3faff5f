"""The study language: what a study YAML may say and what it resolves to.

Every module here is pure (pydantic and the registries below it; nothing trains, nothing is downloaded):

* config sections, all on one strict base (:mod:`lorarl.strict`, below every reader of a section: unknown fields
  are errors, a number is never a boolean): the cell (:mod:`lorarl.language.config`), its task (:mod:`lorarl.language.task`), prompt
  (:mod:`lorarl.language.prompt`) and the toy stages (:mod:`lorarl.language.toy`);
* the study (:mod:`lorarl.language.study`), its matrix of cells (:mod:`lorarl.language.matrix`), their signatures
  (:mod:`lorarl.language.signature`, :mod:`lorarl.language.reserved`), the YAML positions errors point at
  (:mod:`lorarl.language.yamlpos`), the checks before anything runs (:mod:`lorarl.language.preflight`,
  :mod:`lorarl.language.hubcheck`), the cluster profiles (:mod:`lorarl.language.profiles`), the cell kinds
  (:mod:`lorarl.language.kinds`), the evaluation plan (:mod:`lorarl.language.evalplan`) and the adaptive blocks'
  grammar with the cells and settings it names (:mod:`lorarl.language.adaptive`).

The modules keep their own import layers (tests/project/test_structure.py: each is a room of its own); nothing is
re-exported here.
"""
