from largeprompt.io.runlog import run_stage
from largeprompt.stages.concentration import simulate_errors

run_stage(snakemake, simulate_errors)  # noqa: F821 (injected by Snakemake)
