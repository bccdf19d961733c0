from largeprompt.io.runlog import run_stage
from largeprompt.stages.concentration import collect_errors

run_stage(snakemake, collect_errors)  # noqa: F821 (injected by Snakemake)
