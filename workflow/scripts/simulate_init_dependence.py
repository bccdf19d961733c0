from largeprompt.io.runlog import run_stage
from largeprompt.stages.simulate_init_dependence import simulate_init_dependence

run_stage(snakemake, simulate_init_dependence)  # noqa: F821 (injected by Snakemake)
