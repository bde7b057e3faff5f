"""Hugging Face hub references a study names, each in the local cache or answering on the hub, checked before
anything runs or is written (`lorarl run`, `lorarl doctor` and Snakemake alike; `lorarl cells` and `lorarl status`
list a study all the same and name what this machine cannot get).

What is checked, per distinct reference of the study's cells (`references`):
* `model`, `reward.teacher`, `reward.prm_model` (when a regime uses them) given as a hub id: the model's
  `config.json` and its weights (every shard an index names) in the hub cache (`$HF_HUB_CACHE`, else
  `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), on the `main` ref.
* a hub dataset (`task.path` / `task.sources[i].path` given as an id, each `eval.benchmarks` entry without a
  local `path`: its `hub_id`, `subset`, `revision` or the registry's): prepared in the `datasets` cache
  (`$HF_DATASETS_CACHE`, else `$HF_HOME/datasets`), which is what `datasets.load_dataset` reads without
  network; with a revision (`task.revision`, a benchmark's `revision`), that commit (a tag or branch is
  resolved through the hub cache's refs).
* an `hf://datasets/<org>/<name>[@rev]/<file>` address: that file in the hub cache.
`local:<recipe>`, filesystem paths, local files and other URLs are lorarl.language.preflight's (it runs at every load).

A reference not in the cache is asked of the hub (`model_info` / `dataset_info` at its revision, `$HF_ENDPOINT`)
with a deadline of `TIMEOUT_S` seconds in all (a daemon thread: a resolver that never answers cannot hold the
command). Before the first question one probe (lorarl.language.hubreach.Probe: one HTTP request to the endpoint,
through the proxy the hub client takes; a TCP connection a middlebox accepts and never answers is no answer) tells
an offline machine at once: it fails, and no reference is asked; after one connection failure the others are not
asked either. What runs or plans jobs (`lorarl run`, `lorarl doctor`, Snakemake) gives the probe the whole
deadline; what only lists a study (`lorarl cells`, `lorarl status`) starts it before loading the study and gives
it `PROBE_S` (`early_probe`), so a machine without network gets its answer in well under a second. With
`HF_HUB_OFFLINE`, `TRANSFORMERS_OFFLINE` or `HF_DATASETS_OFFLINE` set the hub is never asked. Every reference
that is neither cached nor found is named, with the field that sets it; what runs a study refuses it (exit 2),
what lists one prints those lines (`listing`).

Runtime switch, not science (never a study field): a cluster whose compute nodes reach the hub while the submit
host does not sets `hub_check: false` in its profile's config (profiles/slurm/cluster.yaml, or `--config
hub_check=false`), or `LORARL_HUB_CHECK=0` in the environment; the jobs then resolve hub ids themselves.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from lorarl.language.hubreach import Probe, ask, endpoint
from lorarl.language.matrix import StudyError

ENV = "LORARL_HUB_CHECK"  # 0 / false / off: skip the check (compute nodes reach the hub, this host does not)
OFFLINE_ENVS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
TIMEOUT_S = 5.0  # the whole hub probe of one study, at most
PROBE_S = 0.5  # listing a study: the one request that tells an offline machine (a working one answers in ms)
ABSENT = "the hub has no such repository or revision"  # the hub answered: the study names what does not exist
_FALSE = {"0", "false", "off", "no"}
_SHA = re.compile(r"^[0-9a-f]{40}$")
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass(frozen=True)
class Ref:
    """One hub reference: the study field naming it, the repo and what of it the cell reads."""

    field: str  # the cell-config path that names it (model, eval.benchmarks.gsm8k, task.sources[1].path)
    value: Any  # the value at that path (to find the axis or defaults entry that sets it)
    kind: str  # model | dataset | file (one file of a dataset repo, an hf:// address)
    repo: str
    revision: str | None = None
    config: str | None = None
    filename: str | None = None

    def describe(self) -> str:
        extra = [f"config {self.config}"] if self.config else []
        extra += [f"revision {self.revision}"] if self.revision else []
        extra += [f"file {self.filename}"] if self.filename else []
        kind = "dataset" if self.kind == "file" else self.kind
        return f"{kind} {self.repo!r}" + (f" ({', '.join(extra)})" if extra else "")


def enabled(setting: Any = True) -> bool:
    """The profile's `hub_check` (Snakemake config; true when absent) and `$LORARL_HUB_CHECK` both allow it."""
    if str(setting).strip().lower() in _FALSE:
        return False
    return os.environ.get(ENV, "1").strip().lower() not in _FALSE


def offline() -> str | None:
    """The environment variable that puts Hugging Face offline, if one does."""
    return next((v for v in OFFLINE_ENVS if os.environ.get(v, "").strip().upper() in {"1", "ON", "YES", "TRUE"}), None)


def hf_home() -> Path:
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser()


def hub_cache() -> Path:
    legacy = os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(os.environ.get("HF_HUB_CACHE") or legacy or hf_home() / "hub").expanduser()


def datasets_cache() -> Path:
    return Path(os.environ.get("HF_DATASETS_CACHE") or hf_home() / "datasets").expanduser()


def _hub_id(value: Any) -> bool:
    """An `org/name` (or `name`) hub id: not a local recipe, a path, a URL or a local data file."""
    if not isinstance(value, str) or not value or value.startswith(("local:", "/", "./", "../", "~")):
        return False
    return "://" not in value and not value.endswith(_DATA_SUFFIXES) and value.count("/") <= 1


def _hf_file(field: str, value: str, revision: str | None = None) -> Ref | None:
    """`hf://datasets/<org>/<name>[@rev]/<file>` as a file reference, at the address's revision or `revision`
    (the study's, which the loader writes into the address); None for other addresses."""
    m = re.match(r"^hf://datasets/([^/@]+/[^/@]+)(?:@([^/]+))?/(.+)$", value)
    return Ref(field, value, "file", m.group(1), m.group(2) or revision, None, m.group(3)) if m else None


def references(cfg: Any) -> list[Ref]:
    """The hub references of one cell config (models, teacher, PRM, task datasets, benchmarks)."""
    out: list[Ref] = []
    if not all(hasattr(cfg, a) for a in ("model", "reward", "task", "eval")):
        return out  # another study kind's cell (the toy KL-bound study: nothing on the hub)
    from lorarl.rewards.registry import extra_models  # the teacher / PRM the regime loads

    reward = cfg.reward
    models = [("model", cfg.model)] + [(x.field, x.model) for x in extra_models(reward)]
    if cfg.eval.teacher_benchmarks and ("reward.teacher", reward.written("teacher")) not in models:  # its base row
        models.append(("reward.teacher", reward.written("teacher")))
    out += [Ref(f, v, "model", v) for f, v in models if _hub_id(v)]
    task = cfg.task
    if task.name == "dataset":
        sources = [("task.path", task.path, task.revision, task.config)] if task.path else []
        sources += [(f"task.sources[{i}].path", s.path, s.revision, s.config) for i, s in enumerate(task.sources or ())]
        for field, path, rev, config in sources:
            if _hub_id(path):
                out.append(Ref(field, path, "dataset", path, rev, config))
            elif isinstance(path, str) and (ref := _hf_file(field, path, rev)):
                out.append(ref)
    out += _benchmark_refs(cfg)
    return out


def _benchmark_refs(cfg: Any) -> list[Ref]:
    from lorarl.grading.benchmarks import BENCHMARKS
    from lorarl.language.evalplan.plan import data_revision

    out = []
    for name, spec in (cfg.eval.benchmarks or {}).items():
        bench = BENCHMARKS.get(name)
        repo = spec.hub_id or (bench.hub_id if bench else None)
        if spec.path or not repo:
            continue  # a local file (lorarl.language.preflight checks it exists) or the synthetic split
        rev = data_revision(name, spec) if bench else spec.revision  # the commit the evaluation reads (a mirror: its own)
        config = spec.subset or getattr(bench, "config", None)
        out.append(Ref(f"eval.benchmarks.{name}", name, "dataset", repo, rev, config))
    return out


# ---- the cache ---------------------------------------------------------------------------------------------------

def _repo_dir(ref: Ref) -> Path:
    kind = "models" if ref.kind == "model" else "datasets"
    return hub_cache() / f"{kind}--{ref.repo.replace('/', '--')}"


def _commit(ref: Ref) -> str | None:
    """The commit a revision names: itself when a full sha, else what the hub cache's refs say."""
    rev = ref.revision or "main"
    if _SHA.match(rev):
        return rev
    try:
        return (_repo_dir(ref) / "refs" / rev).read_text().strip() or None
    except OSError:
        return None


def _snapshot(ref: Ref, filename: str) -> Path | None:
    """`filename` in the hub cache's snapshot of the reference's revision (huggingface_hub's
    `try_to_load_from_cache`, 1.33, without importing it and httpx: an offline answer stays fast)."""
    commit = _commit(ref)
    path = _repo_dir(ref) / "snapshots" / commit / filename if commit else None
    return path if path is not None and path.is_file() else None


def _model_cached(ref: Ref) -> bool:
    config = _snapshot(ref, "config.json")
    if config is None:
        return False
    snap = config.parent
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (snap / index).is_file():
            try:
                shards = set(json.loads((snap / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError):
                return False
            return all((snap / s).is_file() for s in shards)
    return any((snap / w).is_file() for w in ("model.safetensors", "pytorch_model.bin"))


def _snake(name: str) -> str:
    """datasets.naming.camelcase_to_snakecase (the datasets cache's folder names), without importing datasets."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def _dataset_cached(ref: Ref) -> bool:
    org, _, name = ref.repo.rpartition("/")
    root = datasets_cache() / "___".join([*([org] if org else []), _snake(name)])
    found = [d for d in root.glob(f"{ref.config or '*'}/*/*") if (d / "dataset_info.json").is_file()]
    if ref.revision is None:
        return bool(found)
    commit = _commit(ref)
    return commit is not None and any(d.name == commit for d in found)


def _file_cached(ref: Ref) -> bool:
    return _snapshot(ref, ref.filename) is not None


def cached(ref: Ref) -> bool:
    return {"model": _model_cached, "dataset": _dataset_cached, "file": _file_cached}[ref.kind](ref)


# ---- the hub -------------------------------------------------------------------------------------------------------

def early_probe() -> Probe | None:
    """What only lists a study (`lorarl cells`, `lorarl status`) starts its probe (`PROBE_S`) before loading the
    study; None when the check is off or Hugging Face is offline (nothing to ask)."""
    return Probe(PROBE_S) if enabled() and not offline() else None


def problems(refs: Iterable[Ref], timeout_s: float | None = None,
             probe: Probe | None = None) -> list[tuple[Ref, str]]:
    """(reference, why) for each reference neither cached nor found on the hub: one probe of the hub (`probe`, one
    started already, else one given the whole `timeout_s`), then, if it answered, each uncached reference asked."""
    budget = TIMEOUT_S if timeout_s is None else timeout_s
    end = time.monotonic() + budget
    todo = [ref for ref in refs if not cached(ref)]
    why_off = offline()
    down: str | None = f"the hub is not asked ({why_off} is set)" if why_off else None
    if todo and down is None:
        why = (probe or Probe(budget)).result()
        down = f"the hub is unreachable ({endpoint()}: {why})" if why else None
    out = []
    for ref in todo:
        if down is None:
            left = end - time.monotonic()
            answer = ask(ref.kind, ref.repo, ref.revision, left) if left > 0 else "unreachable: no answer"
            answer = f"unreachable: no answer in {budget:g} s" if answer.startswith("unreachable: no answer") else answer
            if answer == "found":
                continue
            if answer == "missing":
                out.append((ref, ABSENT))
                continue
            down = f"the hub is unreachable ({endpoint()}: {answer.removeprefix('unreachable: ')})"
        out.append((ref, down))
    return out


def _refs(cells: Iterable[Any]) -> list[Ref]:
    refs: dict[tuple, Ref] = {}
    for cell in cells:
        for ref in references(cell.config):
            refs.setdefault((ref.field, ref.kind, ref.repo, ref.revision, ref.config, ref.filename), ref)
    return list(refs.values())


def _lines(study: Any, bad: list[tuple[Ref, str]]) -> list[str]:
    from lorarl.language.preflight import where

    return [f"{where(study, r.field, r.value)}: {r.describe()}: not in the local cache "
            f"({datasets_cache() if r.kind == 'dataset' else hub_cache()}); {why}" for r, why in bad]


def missing(study: Any, cells: Iterable[Any], timeout_s: float | None = None, probe: Probe | None = None) -> list[str]:
    """One line per hub reference of the cells that is neither cached nor reachable (its study field first)."""
    return _lines(study, problems(_refs(cells), timeout_s, probe))


def _refusal(source: str, bad: list[str], what: str) -> StudyError:
    lines = [f"  {line}" for line in bad]
    return StudyError(
        f"invalid study {source}: {len(bad)} Hugging Face reference(s) {what}:\n"
        + "\n".join(lines) + "\n  allowed: a model or dataset in the local cache (download it where there is "
        "network: `hf download <id>` for a model; run `datasets.load_dataset` once for a dataset; same HF_HOME), "
        "a local path, or local:<recipe> for a model; compute nodes that reach the hub while this host does not: "
        f"`hub_check: false` in the profile's config (or {ENV}=0)")


def check_study(study: Any, cells: Iterable[Any], source: str, timeout_s: float | None = None) -> None:
    """Raise StudyError naming every hub reference of the cells that is neither cached nor reachable."""
    bad = missing(study, cells, timeout_s)
    if bad:
        raise _refusal(source, bad, "neither cached here nor reachable")


def listing(study: Any, cells: Iterable[Any], source: str, probe: Probe | None = None) -> list[str]:
    """What only lists a study (`lorarl cells`): a line per hub reference this machine cannot get now (not cached,
    and the hub offline or unreachable: one probe of `PROBE_S`, `probe` when `early_probe` started it), the study
    listed all the same; a reference the hub answers does not exist is the study's error, refused (StudyError) as
    running it would be."""
    bad = problems(_refs(cells), probe=probe or Probe(PROBE_S))
    absent = [(r, why) for r, why in bad if why == ABSENT]
    if absent:
        raise _refusal(source, _lines(study, absent), "that the hub says do not exist")
    return _lines(study, bad)
