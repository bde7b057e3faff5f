"""Which cells may share a pack: the compatibility key, and the grouping of a study's cells.

Packing is a runtime choice, not science: a pack's members must agree on everything that fixes the
shared frozen base and the shape of the batched forward (model, adapter method, init, target modules,
dropout, precision, lengths, task, prompt, rollout engine) and may differ in the rest (seed, beta,
learning rate, reward regime, ...). Adapter rank and alpha may differ too: the router applies each
member's own LoRA layers and scaling (lorarl.pack.routing), and a multi-LoRA engine's ``max_lora_rank``
is the largest member's (lorarl.pack.multilora) -- except for residual inits, below. Cells that cannot
pack (methods outside the LoRA family, which have no LoRA layers to route, and adapter dropout > 0, whose
masks would come from one RNG stream shared by the pack) get a pack of their own.

``train.temperature`` and ``top_p`` may differ: each cell samples its rows with its own, and its log-probs
(policy and reference) divide its rows' logits by its own temperature.
Choices (stricter than the issue, so the packed update stays exactly the solo one):
``train.steps`` and the batch shape (prompts_per_step, generations, num_iterations, mini-batches),
so every member takes the same optimiser steps. Residual inits (PiSSA, MiLoRA, OLoRA, ...) rewrite the
frozen base with W0 − s·B0A0, a function of the rank and alpha: for them the key keeps rank and alpha and
so fixes the residual (model, adapter rank/alpha/init/targets; SVD inits draw no random numbers): their
residual bases are identical, so they pack (lorarl.pack.build checks it bit for bit). Masks (sparse
updates of the base itself) run solo. ``num_iterations > 1``, PPO mini-batches and DAPO dynamic sampling
run solo too (the packed step loop does not do them). ``rollout.engine: vllm`` cells pack (one multi-LoRA
engine per pack: lorarl.pack.vllm_rollouts) when vLLM serves their adapters as LoRAs (LoRA, rsLoRA; DoRA solo).
"""

from __future__ import annotations

import json
from typing import Any

from lorarl.adapters.names import RESIDUAL_INITS

PACKABLE_METHODS = ("lora", "dora", "rslora")  # LoRA layers the router understands (lorarl.pack.routing)
VLLM_PACKABLE_METHODS = ("lora", "rslora")  # what one multi-LoRA engine serves (lorarl.pack.vllm_rollouts)

PACK_KEYS = ("max_cells", "update_cells", "resident", "places", "gpu_memory_gb")  # the Snakemake config's `pack:`
_TRAIN_KEYS = ("max_completion_length", "max_prompt_length", "prompt_overflow", "precision", "steps",
               "prompts_per_step", "generations", "num_iterations", "mini_batch_prompts")


def pack_key(cfg: Any, lengths: bool = True) -> str | None:
    """The compatibility key of a cell config (``None``: the cell cannot pack). ``lengths=False``: without
    ``train.steps`` (a resident pack's groups, lorarl.pack.resident: each member leaves at its own end)."""
    a, t = cfg.adapter, cfg.train
    if a.method not in PACKABLE_METHODS or (a.dropout or 0) > 0:
        return None  # dropout > 0 would draw from one RNG stream shared by the pack: such cells run solo
    if a.mask is not None:
        return None  # a mask trains the base itself; the pack shares ONE copy of it
    if t.num_iterations > 1 or t.updates_per_generation > 1 or t.dynamic_sampling:
        return None  # the packed step loop takes one update per rollout batch, no refill rounds
    if cfg.rollout.engine == "vllm" and a.method not in VLLM_PACKABLE_METHODS:
        return None  # vLLM serves LoRA adapters only: a DoRA cell samples from merged weights, solo
    adapter = a.model_dump(mode="json")
    if a.init not in RESIDUAL_INITS:  # the base stays W0 whatever the rank: mixed ranks and alphas share a pack
        adapter.pop("rank")
        adapter.pop("alpha")
    key = {
        "model": cfg.model,
        "adapter": adapter,
        "train": {k: getattr(cfg.train, k) for k in _TRAIN_KEYS if lengths or k != "steps"},
        "task": cfg.task.model_dump(mode="json"),
        "prompt": cfg.prompt.model_dump(mode="json"),
        "rollout": cfg.rollout.model_dump(mode="json"),
    }
    return json.dumps(key, sort_keys=True, default=str)


def pack_id(members: list[str], until: int | None = None, resident: bool = False) -> str:
    """A pack job's name: its member ids, hashed (the job's record is results/<study>/.packs/<id>.json); with
    ``until``, a rung's pack (its members train to that step); ``resident``, a resident job. Distinct by
    construction: the hashed text of a fixed pack is its ids (``a,b``), a rung's adds ``,until=<step>`` and a
    resident job's starts with ``resident:``; a cell id holds neither ``=`` nor ``:`` (workflow/rules/common.smk),
    so a resident job never takes the id of an earlier fixed pack of the same cells, nor a rung's pack a whole one's."""
    import hashlib

    text = ",".join([*members, *([f"until={until}"] if until is not None else [])])
    return "pack-" + hashlib.sha1((f"resident:{text}" if resident else text).encode()).hexdigest()[:10]


def _int(v: Any) -> Any:
    """Snakemake's ``--config "pack={max_cells: 4}"`` gives nested values as strings."""
    return int(v) if isinstance(v, str) and v.strip().isdigit() else v


def max_cells(setting: Any) -> int:
    """The profile's / command line's ``pack`` setting → most cells per pack (1 = no packing).
    Accepted: absent/null/false/0/1 (off), an integer K, or ``{max_cells: K}``."""
    value = _int(setting.get("max_cells", 1)) if isinstance(setting, dict) else setting
    if isinstance(setting, dict) and set(setting) - set(PACK_KEYS):
        raise ValueError(unknown_keys(setting))
    if not isinstance(setting, dict) and value in (None, False, 0):
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"pack.max_cells must be an integer >= 1 (1 = no packing); got {value!r}; "
                         "allowed: a whole number >= 1, or pack: 1 / null / false (off)")
    return value


def resident_places(setting: Any) -> int:
    """``pack: {resident: true, places: P}``: the places of each resident job (lorarl.pack.resident), 0 = fixed packs.
    ``places``: an integer >= 1 (and at most ``max_cells`` when that is set: then it must be >= 2, packing on)."""
    if not isinstance(setting, dict) or ("resident" not in setting and "places" not in setting):
        return 0
    resident = setting.get("resident", False)
    resident = {"true": True, "false": False}.get(resident.lower(), resident) if isinstance(resident, str) else resident
    if not isinstance(resident, bool):
        raise ValueError(f"pack.resident must be true or false; got {setting.get('resident')!r}; allowed: true, false")
    places = _int(setting.get("places"))
    if not resident:
        if places is not None:
            raise ValueError(f"pack.places = {places!r} needs pack.resident: true (places are a resident job's); "
                             "allowed: remove pack.places, or set pack.resident: true")
        return 0
    if places is None or isinstance(places, bool) or not isinstance(places, int) or places < 1:
        raise ValueError(f"pack.places must be an integer >= 1 (the cells a resident job holds at once); got {places!r}; "
                         "allowed: a whole number >= 1")
    if "max_cells" in setting:
        cells = max_cells(setting)
        if cells < 2:
            raise ValueError(f"pack.resident: true needs packing, but pack.max_cells = {cells} (off); allowed: "
                             "pack: {resident: true, places: P} or pack: {max_cells: K >= 2, resident: true, places: 1..K}")
        if places > cells:
            raise ValueError(f"pack.places = {places} is more than pack.max_cells = {cells}; allowed: 1..{cells}")
    return places


def unknown_keys(setting: dict) -> str:
    """The error of a `pack:` block with keys lorarl does not know: each named, a near one suggested, the allowed."""
    import difflib

    names = []
    for k in sorted(map(str, set(setting) - set(PACK_KEYS))):
        near = difflib.get_close_matches(k, PACK_KEYS, n=1)
        names.append(f"pack.{k}" + (f" (did you mean pack.{near[0]}?)" if near else ""))
    return f"unknown key(s) {', '.join(names)}; allowed: {', '.join('pack.' + k for k in PACK_KEYS)}"


def gpu_memory_gb(setting: Any) -> float | None:
    """``pack.gpu_memory_gb``: the GiB of the GPU a pack job runs on, for the check of ``pack.places`` against the
    memory plan before any job starts (None: not given; the local launcher's jobs use this host's GPU)."""
    value = setting.get("gpu_memory_gb") if isinstance(setting, dict) else None
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = -1.0
    if isinstance(value, bool) or not out > 0:
        raise ValueError(f"pack.gpu_memory_gb must be a number of GiB > 0 (the pack jobs' GPU); got {value!r}; "
                         "allowed: a number > 0")
    return out


def update_cells(setting: Any) -> int:
    """``pack.update_cells``: cells per forward/backward of a pack's update (0 = all at once, the default;
    1 = one cell at a time: the same result bit for bit, the activations of one cell, no slower on a CPU)."""
    value = _int(setting.get("update_cells", 0)) if isinstance(setting, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"pack.update_cells must be an integer >= 0 (0 = all cells at once); got {value!r}; "
                         "allowed: a whole number >= 0")
    return value


def plan_packs(cells: list[Any], max_cells: int, breakeven: dict | None | bool = True) -> list[list[str]]:
    """Cell ids grouped into packs of at most ``max_cells``, in study order; ``max_cells = 1``: no packing.
    A vLLM pack the measured break-even table says loses to solo runs is split into solo runs, with a log line
    (lorarl.pack.breakeven). ``breakeven``: that table (True: this host's device's; None/False: no check)."""
    if not isinstance(max_cells, int) or isinstance(max_cells, bool) or max_cells < 1:
        raise ValueError(f"pack.max_cells must be an integer >= 1; got {max_cells!r}")
    groups: dict[str, list[str]] = {}
    packs: list[list[str]] = []
    for c in cells:
        key = pack_key(c.config) if max_cells > 1 else None
        if key is None:
            packs.append([c.id])
            continue
        if key not in groups or len(groups[key]) == max_cells:
            groups[key] = []
            packs.append(groups[key])
        groups[key].append(c.id)
    return split_losing(packs, cells, breakeven)


def split_losing(jobs: list[list[str]], cells: list[Any], breakeven: dict | None | bool = True,
                 places: int = 0) -> list[list[str]]:
    """``jobs`` (cell ids), each vLLM job of several cells that the measured break-even table says loses to solo runs
    split into solo runs, with a log line (lorarl.pack.breakeven); the others as they are. The table is asked at the
    adapters one engine holds at once: a fixed pack's members, a resident job's ``min(places, members)`` (its engine
    has ``places`` slots, lorarl.pack.resident.engine_for), at the job's largest saved rank. ``breakeven``: that table
    (True: this host's device's; None/False: no check). The fixed packs' rule (:func:`plan_packs`); the hosting plan
    (lorarl.pack.hosting) asks it for resident jobs."""
    by = {c.id: c for c in cells}
    vllm = [p for p in jobs if len(p) > 1 and by[p[0]].config.rollout.engine == "vllm"]
    if not vllm or not breakeven:
        return jobs
    from lorarl.pack.breakeven import host_table, say, verdict

    table = host_table() if breakeven is True else breakeven
    out: list[list[str]] = []
    for p in jobs:
        k = min(places, len(p)) if places else len(p)
        v = verdict(table, k, max(saved_rank(by[i].config) for i in p)) if table and p in vllm else None
        if v is not None and not v.pack:
            what = f"resident vLLM job of {len(p)} cells with {places} places" if places else \
                f"vLLM pack of {len(p)} cells"
            say(f"[lorarl] pack: declined a {what} ({', '.join(p)}): {v.why}; they train solo")
            out += [[i] for i in p]
        else:
            out.append(p)
    return out


def saved_rank(cfg: Any) -> int:
    """The rank a cell's adapter is handed to vLLM at: a residual init's is saved converted at 2r."""
    return cfg.adapter.rank * (2 if cfg.adapter.init in RESIDUAL_INITS else 1)
