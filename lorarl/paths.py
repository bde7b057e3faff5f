"""Every file a stage reads or writes, in one place (Snakemake rules use the same patterns)."""

from __future__ import annotations

from pathlib import Path

# A trained cell's outputs, as the train rule declares them, in publishing order: summary.json last (the "done"
# mark). The solo job (lorarl.train.cellrun), a pack's hand-over (lorarl.pack.publish) and the kept-aside outputs of
# a killed run (lorarl.train.salvage) move them in this order.
CELL_OUTPUTS = ("cell.json", "metrics.csv", "adapter", "summary.json")

# Patterns with {results}, {study}, {cell}, {name}, {benchmark} placeholders.
PATTERNS = {
    "base_model": "{results}/models/{name}/config.json",
    "cell_json": "{results}/{study}/{cell}/cell.json",
    "metrics": "{results}/{study}/{cell}/metrics.csv",
    "summary": "{results}/{study}/{cell}/summary.json",
    "adapter": "{results}/{study}/{cell}/adapter",
    "eval_samples": "{results}/{study}/{cell}/eval/{benchmark}.jsonl",
    "eval_summary": "{results}/{study}/{cell}/eval/{benchmark}.json",
    "eval_step_samples": "{results}/{study}/{cell}/eval/{benchmark}@{step}.jsonl",  # eval.eval_every snapshots
    "eval_step_summary": "{results}/{study}/{cell}/eval/{benchmark}@{step}.json",
    "snapshot": "{results}/{study}/{cell}/snapshots/step-{step}",  # adapter saved at a training step
    "eval_curves": "{results}/{study}/tables/eval_curves.csv",
    "diagnostics": "{results}/{study}/{cell}/diagnostics.parquet",
    "toy_done": "{results}/{study}/.toy/done.json",
    "pack_done": "{results}/{study}/.packs/{pack}.json",  # a pack job's record (lorarl.pack.run)
    "logs": "{results}/{study}/{cell}/logs",
    "checkpoints": "{results}/{study}/.checkpoints/{cell}",
    "table_csv": "{results}/{study}/tables/summary.csv",
    "table_md": "{results}/{study}/tables/summary.md",
    "figures": "{results}/{study}/figures",
    "search_ledger": "{results}/{study}/adaptive/search.json",  # successive-halving decisions (lorarl.adaptive.ledger)
    "hypotheses_ledger": "{results}/{study}/adaptive/hypotheses.json",  # sequential comparisons (lorarl.adaptive.ledger)
    "rung_mark": "{results}/{study}/{cell}/rungs/step-{step}.json",  # a train job stopped at a rung (lorarl.train.until)
    "rung_view": "{results}/{study}/adaptive/{tag}/rung-{step}-{n}.json",  # a rung's decisions (checkpoint rule)
    "study_set": "{results}/{study}/study_set.yaml",  # the study as a `--config set=...` run has it (lorarl.study_set)
    "hypothesis_look": "{results}/{study}/adaptive/{tag}/{hypothesis}-{n}.json",  # a look after n seeds (checkpoint rule)
}


def pattern(kind: str, **fixed: str) -> str:
    """A path pattern with some placeholders filled (e.g. results=...), others left for Snakemake."""
    text = PATTERNS[kind]
    for k, v in fixed.items():
        text = text.replace("{" + k + "}", str(v))
    return text


def path(kind: str, **values: str) -> Path:
    return Path(PATTERNS[kind].format(**values))


PACKS = ".packs"  # under a study's results: the packs' records (`<id>.json`) and folders (`<id>/`: logs, provenance)


def pack_folder(pack: str) -> str:
    """A pack job's folder under its study's results, as a cell's (its logs, provenance, cost records); ``pack``:
    its id, or a glob ("*")."""
    return f"{PACKS}/{pack}"


def cell_dir(results: str | Path, study: str, cell: str) -> Path:
    return Path(results) / study / cell
