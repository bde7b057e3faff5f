"""A Snakemake profile's settings as a study runs with it: config/config.yaml < the profile's `config:` <
its configfile < `--config` overrides, each merged into the last as Snakemake merges them (mappings key by key). Read by `lorarl doctor` (lorarl.pipeline.doctor.report) and
`lorarl memory --profile` (lorarl.memory.report), below both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lorarl.language.matrix import StudyError

ROOT = Path(__file__).resolve().parents[2]  # the checkout: config/ and profiles/ live here


def merge(config: Any, over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``config`` as Snakemake merges config files and ``--config`` (its
    ``snakemake.utils.update_config``): a mapping into a mapping key by key, anything else replaces."""
    out = dict(config) if isinstance(config, dict) else {}
    for key, value in over.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def read_profile(profile: str | None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """launcher, Slurm resources per stage, MLflow store and concurrent jobs of a Snakemake profile (as the
    study runs: config/config.yaml < the profile's `config:` < its configfile < `--config` overrides)."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text()) or {}
    name = profile or "default"
    pdir = ROOT / "profiles" / name if (ROOT / "profiles" / name).is_dir() else Path(name)
    if not (pdir / "config.yaml").exists():
        known = sorted(p.name for p in (ROOT / "profiles").iterdir() if p.is_dir())
        raise StudyError(f"--profile {profile!r}: no such profile; allowed: {', '.join(known)} or a profile folder")
    prof = yaml.safe_load((pdir / "config.yaml").read_text()) or {}
    merged = merge(base, prof.get("config") or {})
    if prof.get("configfile"):
        merged = merge(merged, yaml.safe_load((pdir / prof["configfile"]).read_text()) or {})
    merged = merge(merged, overrides or {})
    jobs = int(prof.get("jobs") or prof.get("cores") or 1)
    return {"name": name, "dir": pdir if profile else None, "launcher": merged.get("launcher", "local"),
            "slurm": merged.get("slurm") or {},
            "jobs": jobs, "tracking": merged.get("tracking") or "sqlite", "pack": merged.get("pack"),
            "tracking_credentials": merged.get("tracking_credentials") or "",
            "hub_check": merged.get("hub_check", True)}
