"""Adaptive studies: spend training where it still decides something (docs/adaptive.md).

Every module is a small pure layer; none imports the workflow, the report or MLflow. The study-language side
lives in :mod:`lorarl.language.adaptive`: the blocks ``search:`` and ``hypotheses:`` and their checks (``blocks``,
called by ``lorarl.language.study.load_study``), the seeds a hypothesis adds, and the settings (cells that differ only
in the paired axes, e.g. seed). Here:

* ``records``: the files a decision reads (rung values from the cells' own ``eval/<b>@<step>.json``,
  failures from ``summary.json``, per-problem scores from the final ``eval/<b>.jsonl``);
* ``halving``: ``decide(spec, settings, records, previous)``: successive halving (sync or async),
  a pure function of the records;
* ``ledger``: the ledger file ``results/<study>/adaptive/search.json`` (atomic, byte-identical on a rerun)
  and the per-cell plan the workflow reads (train to a rung, to the end, stopped, failed);
* ``sequential``: the group-sequential boundaries (alpha spending, t statistics) and repeated intervals;
* ``hypotheses``: per hypothesis the paired difference per seed, its interval, its decision and
  whether it needs another seed.

Nothing here is imported at package import, nor by the study language.
"""
