from largeprompt.io.runlog import run_stage
from largeprompt.stages.concentration import estimate_rates

run_stage(snakemake, estimate_rates)  # noqa: F821 (injected by Snakemake)
