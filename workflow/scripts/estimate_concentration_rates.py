from largeprompt.io.runlog import run_stage
from largeprompt.stages.estimate_concentration_rates import estimate_concentration_rates

run_stage(snakemake, estimate_concentration_rates)  # noqa: F821 (injected by Snakemake)
