"""Where a cell's prompts and gold answers come from (the study's ``task:`` section): the synthetic
task, one dataset, or a mixture of datasets (``task.sources``), each with its own columns and share.

Read by :mod:`lorarl.language.config` (the cell's ``task:`` field); import it from here. Every field carries a
one-line comment saying *why* it exists; unknown fields are errors.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from lorarl.strict import Strict
from lorarl.tasks import FILE_SUFFIXES, HUB_FILE  # where a task's data comes from (read by its loader)

UNSET = {"split": "train", "revision": None, "config": None, "prompt_field": "prompt", "answer_field": "answer",
         "unwrap": None}  # TaskConfig's one-dataset fields at their defaults (a mixture sets them per source)


REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")  # a commit hash, tag or branch name


def revision_problem(path: str | None, config: str | None, revision: str | None, where: str) -> str | None:
    """Why ``config`` / ``revision`` cannot apply to the dataset at ``path`` (None: they can). A revision pins a hub
    dataset (id or folder) or a file inside one (``hf://datasets/...``, where the loader writes it into the
    address); a local file has neither; an address that already pins a revision takes no second one."""
    is_file = str(path).endswith(FILE_SUFFIXES)
    if config and is_file:
        return f"{where}config applies to a hub dataset (id or folder), not to a .jsonl/.parquet file"
    if revision is None:
        return None
    if not REVISION.fullmatch(revision):
        return f"{where}revision {revision!r} must be a commit hash, tag or branch (letters, digits, . _ / -)"
    if is_file and not str(path).startswith(HUB_FILE):
        return f"{where}revision pins a hub dataset or a file inside one (hf://datasets/...); {path} is a local file"
    if is_file and "@" in str(path)[len(HUB_FILE):].split("/")[1]:
        return f"{where}revision: the address {path} already pins a revision (@...); give it once"
    return None


def check_field_spec(v: str | list[str], what: str) -> str | list[str]:
    """A column path, or a non-empty list of distinct non-empty alternatives (the first the file has is read)."""
    paths = [v] if isinstance(v, str) else list(v)
    if not paths or any(not p for p in paths) or len(set(paths)) != len(paths):
        raise ValueError(f"{what} must be a column path (a.b: key b of struct column a) or a list of distinct "
                         f"alternatives, the first the file has being read; got {v!r}")
    return v


class TaskSource(Strict):
    """One dataset of a mixture (``task.sources``): where its rows are, which columns hold the question
    and the gold answer, and its share: a ``weight`` (of ``task.mix_size`` rows) or a ``count``."""

    path: str  # hub id, local .jsonl/.json/.parquet file, or hf://datasets/<org>/<name>[@rev]/<file>
    config: str | None = None  # the hub configuration; None = the dataset's default
    split: str = "train"  # split to draw from
    revision: str | None = None  # pin the hub revision (commit/tag) so a dataset update cannot move the numbers (also of an hf://datasets/ file)
    prompt_field: str | list[str] = "prompt"  # column holding the question (a.b: key b of struct column a; a list: alternatives, the first the file has)
    answer_field: str | list[str] = "answer"  # column holding the gold answer (a.b: key b of struct column a; a list: alternatives)
    unwrap: Literal["dapo"] | None = None  # the prompt column is this dataset's instructed message; the bare problem is taken out (as task.unwrap)
    weight: float | None = Field(None, gt=0)  # share of task.mix_size (rows drawn in proportion; a source smaller than its share repeats whole)
    count: int | Literal["all"] | None = None  # rows drawn from this source (without repeats); all = every row once

    @field_validator("prompt_field", "answer_field")
    @classmethod
    def _field_spec(cls, v: str | list[str], info: Any) -> str | list[str]:
        return check_field_spec(v, f"task.sources[].{info.field_name}")

    @model_validator(mode="after")
    def _check(self) -> "TaskSource":
        if (self.weight is None) == (self.count is None):
            raise ValueError("a task source takes either weight (a positive share of task.mix_size) or count "
                             f"(a positive number of rows, or all); got weight={self.weight}, count={self.count}")
        if isinstance(self.count, int) and self.count <= 0:
            raise ValueError(f"count must be a positive number of rows or all; got {self.count}")
        why = revision_problem(self.path, self.config, self.revision, "")
        if why:
            raise ValueError(why)
        return self

    def label(self) -> str:
        """How error messages and record ids name this source."""
        return self.path + (f" ({self.config})" if self.config else "") + f" [{self.split}]"


class TaskConfig(Strict):
    name: Literal["synthetic", "dataset"] = "synthetic"  # synthetic arithmetic (CPU) or a real dataset
    seed: int = 1234  # fixes the train/eval split and a mixture's draw; shared by all cells so evals are comparable
    n_train: int = Field(2000, gt=0)  # synthetic: number of training prompts generated
    n_eval: int = Field(200, gt=0)  # synthetic: held-out problems used for pass@1
    min_operands: int = Field(2, ge=2)  # synthetic: fewest numbers per problem (1 step)
    max_operands: int = Field(3, ge=2)  # synthetic: most numbers per problem (= steps + 1)
    max_value: int = Field(20, ge=2)  # synthetic: operands drawn from [1, max_value] (tiny bases use 20)
    path: str | None = None  # dataset: hub id or local .jsonl/.parquet path
    split: str = "train"  # dataset: split to train on
    revision: str | None = None  # dataset: pin the hub revision (commit/tag) so a dataset update cannot move the numbers (also of an hf://datasets/ file)
    config: str | None = Field(None, json_schema_extra={"signature_omits_default": True})  # dataset: the hub configuration (DAPO-Math-17k-Processed: all / en / cn); None = the dataset's default
    prompt_field: str | list[str] = "prompt"  # dataset: column holding the question (a list: alternatives, the first the file has)
    answer_field: str | list[str] = "answer"  # dataset: column holding the gold answer (a list: alternatives)
    unwrap: Literal["dapo"] | None = Field(None, json_schema_extra={"signature_omits_default": True})  # dataset: the prompt column is this dataset's instructed message (dapo: DAPO-Math's "Answer:" wrapper); the bare problem is taken out of it, so the cell's own template is the one instruction (paper 002)
    prompt_rendered: bool = False  # dataset: the prompt column already is prompt.template's text (DAPO-Math's instructed prompt): checked, not wrapped again
    sources: list[TaskSource] | None = Field(None, min_length=1, json_schema_extra={"signature_omits_default": True})  # dataset: a mixture of datasets (instead of path), each with its own columns and a weight or count; drawn with task.seed (paper 004's DS+SR)
    mix_size: int | None = Field(None, gt=0, json_schema_extra={"signature_omits_default": True})  # dataset mixture by weight: rows in the mixture; null = the sources' rows together

    @field_validator("prompt_field", "answer_field")
    @classmethod
    def _field_spec(cls, v: str | list[str], info: Any) -> str | list[str]:
        return check_field_spec(v, f"task.{info.field_name}")

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if self.max_operands < self.min_operands:
            raise ValueError("max_operands must be >= min_operands")
        if self.sources is not None:
            self._check_mixture()
        elif self.name == "dataset" and not self.path:
            raise ValueError("task.path (one dataset) or task.sources (a mixture) is required when task.name is 'dataset'")
        if self.mix_size is not None and not (self.sources and self.sources[0].weight is not None):
            raise ValueError("task.mix_size applies to a mixture by weight (task.sources with weight); "
                             "sources with count set their rows themselves")
        if (self.config or self.revision) and self.name != "dataset":
            raise ValueError("task.config / task.revision apply to a hub dataset (task.name 'dataset'), not to the "
                             "synthetic task")
        why = revision_problem(self.path, self.config, self.revision, "task.")
        if why:
            raise ValueError(why)
        if self.unwrap and (self.prompt_rendered or self.name != "dataset"):
            raise ValueError("task.unwrap applies to task.name 'dataset' and takes the bare problem out of the prompt "
                             "column; task.prompt_rendered uses the column as the whole message: set one of them")
        if self.prompt_rendered and self.name != "dataset":
            raise ValueError("task.prompt_rendered applies to task.name 'dataset' only (synthetic prompts are raw)")
        return self

    def _check_mixture(self) -> None:
        if self.name != "dataset":
            raise ValueError("task.sources applies to task.name 'dataset' only")
        set_ = [k for k, default in UNSET.items() if getattr(self, k) != default] + (["path"] if self.path else [])
        if set_:
            raise ValueError(f"task.sources sets every dataset's own {', '.join(sorted(set_))}: leave task."
                             f"{sorted(set_)[0]} unset (set it in each source)")
        modes = {"weight" if s.weight is not None else "count" for s in self.sources}
        if len(modes) > 1:
            raise ValueError("task.sources mixes weight and count: give every source a weight (shares of "
                             "task.mix_size) or every source a count (rows, or all)")
        seen: dict[tuple, int] = {}
        for i, s in enumerate(self.sources):
            key = (s.path, s.config, s.split, s.revision)
            if key in seen:
                raise ValueError(f"task.sources[{i}] repeats task.sources[{seen[key]}] ({s.label()}); "
                                 "give one source a larger weight or count instead")
            seen[key] = i
            if s.unwrap and self.prompt_rendered:
                raise ValueError(f"task.sources[{i}].unwrap takes the bare problem out of the prompt column; "
                                 "task.prompt_rendered uses the column as the whole message: set one of them")
