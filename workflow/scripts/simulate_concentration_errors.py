from largeprompt.io.runlog import run_stage
from largeprompt.stages.simulate_concentration_errors import simulate_concentration_errors

run_stage(snakemake, simulate_concentration_errors)  # noqa: F821 (injected by Snakemake)
