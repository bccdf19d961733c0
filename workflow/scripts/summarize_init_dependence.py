from largeprompt.io.runlog import run_stage
from largeprompt.stages.summarize_init_dependence import summarize_init_dependence

run_stage(snakemake, summarize_init_dependence)  # noqa: F821 (injected by Snakemake)
