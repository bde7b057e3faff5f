# Packed cells (lorarl.pack): with `pack: {max_cells: K}` (a profile's config, or `--config pack=K`),
# the UNFINISHED cells of a study that share a compatibility key (lorarl.pack.plan.pack_key) are grouped
# into packs of at most K (the hosting plan: lorarl.pack.hosting), and each pack of two or more is ONE job
# (`lorarl launch pack`) that trains them all in one process and stages each member's outputs. Each
# member's own `train` job (unchanged: same command, params and inputs, so switching packing on or off never
# reruns a finished cell) waits for its pack and moves the staged outputs into place (lorarl.pack.handover: one
# state file per member, planned here in `onstart`, claimed by the pack's launcher, staged by its job).
# Finished cells are never packed: `--forcerun <cell>/summary.json` retrains that cell alone, solo. Resident packs
# (`pack: {resident: true, places: P}`, lorarl.pack.resident): one job per compatible group (train.steps may
# differ) holds P places and admits the next waiting cell when a place frees; the same rule, hand-over, records.
from lorarl.pack.plan import gpu_memory_gb as _pack_gpu_memory_gb, max_cells as _pack_max_cells
from lorarl.pack.plan import resident_places as _pack_resident_places, update_cells as _pack_update_cells
from lorarl.pack.handover import HandOver as _HandOver, clear_stale as _pack_clear_stale
from lorarl.pack.resident import check_places as _pack_check_places, host_gpu_memory_gb as _host_gpu_memory_gb
from lorarl.pack.hosting import Runtime as _HostingRuntime, hosting_plan as _hosting_plan, pack_jobs as _pack_jobs

try:  # every `pack:` key checked here (the schema leaves the block to lorarl.pack.plan): exit 2 naming the field
    PACK_MAX_CELLS = _pack_max_cells(config.get("pack"))
    PACK_UPDATE_CELLS = _pack_update_cells(config.get("pack"))
    PACK_PLACES = _pack_resident_places(config.get("pack"))  # resident packs: places per job (0: fixed packs)
    PACK_GPU_GB = _pack_gpu_memory_gb(config.get("pack"))  # the pack jobs' GPU (None: this host's, for local jobs)
except ValueError as err:
    print(f"error: config: {err}", file=sys.stderr)  # before any job runs or anything is written
    sys.exit(2)


# Who trains each unfinished cell (solo, a fixed pack, a resident job; to its end or a rung of the search) is the
# hosting plan (lorarl.pack.hosting.hosting_plan, also the doctor's): this file reads its pack jobs, decides nothing.
RUNTIME = _HostingRuntime(max_cells=PACK_MAX_CELLS, places=PACK_PLACES, search_on=SEARCH_ON)
HOSTS = {s: _hosting_plan(st, RUNTIME, RESULTS, TABLES[s]) for s, (_, st) in STUDIES.items()
         if "train" in get_kind(st.kind).cell_stages and (PACK_MAX_CELLS > 1 or PACK_PLACES)}
PACK_HOSTS = {s: _pack_jobs(plan) for s, plan in HOSTS.items()}  # study -> pack id -> its members' Host
PACKS = {s: {pid: list(h.members) for pid, h in jobs.items()} for s, jobs in PACK_HOSTS.items()}  # pack id -> ids


def _check_places():
    """Resident places the memory plan refuses exit 2 here, before any job starts (the job checks the same at its
    start, lorarl.pack.resident.check_places; refused there, its members would train elsewhere). The GPU: the
    setting `pack.gpu_memory_gb`, else this host's for local jobs; none known (Slurm without the setting, or a CPU):
    the job's own check only."""
    if not PACK_PLACES or not any(PACKS.values()):
        return
    gb = PACK_GPU_GB if PACK_GPU_GB is not None else (
        _host_gpu_memory_gb() if config["launcher"] in ("local", "debug") else None)
    if not gb:
        return
    for s, packs in PACKS.items():
        for pid, members in packs.items():
            try:
                _pack_check_places(PACK_PLACES, [TABLES[s].cell(c).config for c in members], gpu_memory_gb=gb)
            except ValueError as err:
                print(f"error: config: study {s}, resident job {pid} ({len(members)} cells): {err}", file=sys.stderr)
                sys.exit(2)


_check_places()


def pack_targets():
    """The record of every pack to train (empty when packing is off or every cell is done)."""
    return [paths.pattern("pack_done", results=RESULTS, study=s, pack=p) for s, packs in PACKS.items() for p in packs]


def claim_packs():
    """`onstart` (nothing runs yet): remove the stale hand-over states a kill left (lorarl.pack.handover.clear_stale,
    one line each), then plan the members of every pack job this run executes, in Snakemake's name, so that a
    member's own train job that starts before its pack's launcher waits for it (lorarl.pack.handover)."""
    for s, (_, st) in STUDIES.items():
        if "train" in get_kind(st.kind).cell_stages and os.path.isdir(os.path.join(RESULTS, s)):
            _pack_clear_stale(RESULTS, s, TABLES[s].ids)
    for job in workflow.dag.needrun_jobs():
        if job.rule.name == "train_pack":
            study, pid = job.wildcards_dict["study"], job.wildcards_dict["pack"]
            for c in PACKS[study][pid]:
                _HandOver.of(RESULTS, study, c).plan(pid)



def pack_until(wildcards):
    """`--until` of a pack job: its rung, or empty (to the end)."""
    until = PACK_HOSTS[wildcards.study][wildcards.pack].until
    return "" if until is None else str(until)


def pack_members(wildcards):
    return ",".join(PACKS[wildcards.study][wildcards.pack])


def pack_hashes(wildcards):
    """Rerun trigger: the members' training signatures."""
    table = TABLES[wildcards.study]
    return ",".join(table.cell(c).hash for c in PACKS[wildcards.study][wildcards.pack])


class _MemberWildcards:
    def __init__(self, study, cell):
        self.study, self.cell = study, cell

    def keys(self):
        return ["study", "cell"]


def pack_base_input(wildcards):
    """The local models the members need (one base model: it is in the compatibility key)."""
    out = []
    for c in PACKS[wildcards.study][wildcards.pack]:
        out += base_model_input(_MemberWildcards(wildcards.study, c))
    return list(dict.fromkeys(out))


rule train_pack:
    input:
        pack_base_input,
    output:
        paths.pattern("pack_done", results=RESULTS),
    wildcard_constraints:
        study=GRPO_STUDIES,
        pack=r"pack-[0-9a-f]{10}",
    params:
        stage="pack",
        study=study_file,
        target=pack_members,
        config_hash=pack_hashes,
        results=RESULTS,
        launcher=config["launcher"],
        update_cells=PACK_UPDATE_CELLS,
        places=PACK_PLACES or "",
        until=pack_until,
    priority: PACK_PRIORITY
    threads: 1
    retries: OOM_RETRIES
    resources:
        oom_attempt=oom_attempt,
    log:
        f"{RESULTS}/{{study}}/.packs/{{pack}}.log",
    shell:
        launch("pack", OOM_ATTEMPT + " --update-cells={params.update_cells} --places={params.places} "
               "--until={params.until} --pack-id={wildcards.pack}")
