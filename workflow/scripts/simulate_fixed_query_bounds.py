from largeprompt.io.runlog import run_stage
from largeprompt.stages.fixed_query_bounds import simulate_fixed_query_bounds

run_stage(snakemake, simulate_fixed_query_bounds)  # noqa: F821 (injected by Snakemake)
