# lorarl: one job per cell and stage; `snakemake all` runs every study in config/config.yaml.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/adaptive.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/pack.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/diagnose.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    input:
        all_targets() + pack_targets(),
        adaptive_pending,
    default_target: True


onstart:
    keep_finished_aside()
    claim_packs()
    start_progress()


onsuccess:
    print_outputs()


onerror:
    print_failures()
